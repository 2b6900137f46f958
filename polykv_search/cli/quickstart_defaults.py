"""quickstart's defaults, chosen by measurement on 2 CPU cores (the numbers: docs/quickstart.md).

The aim: the whole run stays within 12 minutes on 2 cores (issue 61; ``--full`` adds the entries that
earlier runs showed to repeat what another entry shows), and its report can resolve what the
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
#: evaluation samples per task: 7 resolve what 9 did (issue 61: the 2026-12-07 run's first 7 samples per task
#: give the same findings and recommendation; docs/quickstart.md) for about 100 s less on 2 cores
EVAL_SAMPLES = 7
#: ``--full``: the 9 samples per task of the runs before issue 61
FULL_EVAL_SAMPLES = 9
#: solvers run by default: the paper's rule, ilp (the least predicted KL) and one more layer-budget rule,
#: PyramidKV's schedule (issue 61: the other rules landed within a few points of these on both suites)
METHODS = ("proportional", "ilp", "pyramid")
#: ``--full``: every solver (dp and optuna found ilp's and proportional's strategies in the 2026-12-06 run)
FULL_METHODS = ("proportional", "ilp", "dp", "squeeze", "cake", "pyramid", "optuna")
#: baselines scored by default: FullKV, the best uniform on both suites (KVzip's own allocation,
#: studies/results.md, section 7) and the lowest-KL uniform (h2o), the two references of the report's findings
BASELINES = "full,uniform:h2o,uniform:kvzip[allocation=model]"
#: ``--full``: the 2023-24 uniforms too
FULL_BASELINES = "full,uniform:snapkv,uniform:tova,uniform:h2o,uniform:streaming_llm,uniform:kvzip[allocation=model]"
OPTUNA_TRIALS = 6
#: the head-level entry (quickstart_heads.py): head cells at these budgets, of these patterns
HEAD_LEVEL = True
HEAD_CELLS = "32,64,128"
#: with KVzip's pool among the head cells, as in the study that met issue 26's target (H24)
HEAD_PATTERNS = "streaming_llm,h2o,kvzip[allocation=model]"
