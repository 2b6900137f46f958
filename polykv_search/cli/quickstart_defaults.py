"""quickstart's defaults, chosen by measurement on 2 CPU cores (the numbers: docs/quickstart.md).

The aim: the whole run stays within 15 minutes on 2 cores, and its report can resolve what the
studies found (studies/results.md) — ilp's lower KL than the best uniform on the broad suite, and a
budget where ruler is off its floor (FullKV resolved above the best uniform, the best uniform above
0). At B = 64 of a 512-token context (12.5 % of the cache) every entry was at ruler's floor; the
regime sweep of studies/results.md had ruler leave its floor at a quarter of the cache, so B = 128 of
512. The calibration grid reaches 256 (above B), so that ilp can move budgets between layers
upwards as well as down; calibration and evaluation share the 512-token length.
"""

from __future__ import annotations

#: global budget B: a quarter of the 512-token context
BUDGET = 128
#: calibration and evaluation context, and the calibration continuation
CONTEXT_LEN = 512
CONTINUATION_LEN = 32
#: calibration samples and the signal grid's budgets (above B, so budgets can move up)
CALIB_SAMPLES = 2
GRID_BUDGETS = "32,64,128,256"
#: evaluation samples per task
EVAL_SAMPLES = 9
#: solvers run, and the baselines scored beside them
METHODS = ("proportional", "ilp", "dp", "squeeze", "cake", "pyramid", "optuna")
#: the best uniform on ruler is KVzip's own allocation (studies/results.md, section 7): a verdict against the
#: best uniform must include it
BASELINES = "full,uniform:snapkv,uniform:tova,uniform:h2o,uniform:streaming_llm,uniform:kvzip[allocation=model]"
OPTUNA_TRIALS = 6
#: the head-level entry (quickstart_heads.py): head cells at these budgets, of these patterns
HEAD_LEVEL = True
HEAD_CELLS = "32,64,128"
#: with KVzip's pool among the head cells, as in the study that met issue 26's target (H24)
HEAD_PATTERNS = "streaming_llm,h2o,kvzip[allocation=model]"
