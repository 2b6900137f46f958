"""Give a head-level strategy solved from a prefill-only table the same head groups in decoding (what
the head solvers do when the table has both phases: decoding follows prefill's heads). The head cells
do not depend on the table's layer-level phases; the study's table was collected for prefill only.

    python -m studies.kvzip.decoding_follows_prefill STRATEGY.json ...   # from the repository root; rewrites them
"""

import sys

import polykv_search  # noqa: F401  (registers the patterns strategies are checked against)
from strategies import Strategy

for path in sys.argv[1:]:
    s = Strategy.load(path)
    s = Strategy(
        list(s.prefill),
        list(s.prefill),
        s.global_budget,
        s.b_min,
        {**s.provenance, "decoding": "the prefill head groups (studies/kvzip/decoding_follows_prefill.py)"},
        context_len=s.context_len,
        num_kv_heads=s.num_kv_heads,
    )
    s.save(path)
    print(path, "decoding = prefill head groups")
