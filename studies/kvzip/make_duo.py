"""Two DuoAttention-style head-group strategies for SmolLM2 from the calibration-split retrieval scores
(studies/heads/retrieval_heads_smollm2.json: 24 calibration samples, 1,024 tokens), by solvers.duo's rule.

    python -m studies.kvzip.make_duo OUTDIR     # from the repository root; writes OUTDIR/duo.json, duo-k5.json"""

import json
import sys

import numpy as np

from solvers.duo import fit
from strategies import LayerChoice, Strategy
from strategies.head_groups import HeadGroup

scores = np.asarray(json.load(open("studies/heads/retrieval_heads_smollm2.json"))["mean"])
L, H = scores.shape
B, n, n_sink = 256, 1024, 4
total = H * int(L * B)
order = np.lexsort((np.arange(L * H), -scores.reshape(-1)))
for name, k_fixed in (("duo", None), ("duo-k5", 5)):
    k, s = fit(L * H, total, n, min(n_sink + 60, B), k_fixed)
    full = set(order[:k].tolist())
    layers = []
    for layer in range(L):
        heads_full = tuple(h for h in range(H) if layer * H + h in full)
        heads_stream = tuple(h for h in range(H) if layer * H + h not in full)
        groups = []
        if heads_full:
            groups.append(HeadGroup(heads_full, "full", n, {}))
        if heads_stream:
            groups.append(HeadGroup(heads_stream, "streaming_llm", s, {"n_sink": n_sink}))
        layers.append(LayerChoice.grouped(groups))
    signals = "studies/heads/retrieval_heads_smollm2.json"
    prov = {"solver": "duo", "full_heads": k, "streaming_budget": s, "signals": signals}
    strategy = Strategy(layers, list(layers), B, 1, prov, context_len=n, num_kv_heads=H)
    strategy.save(f"{sys.argv[1]}/{name}.json")
    print(name, "full heads", k, "streaming budget", s, "mean budget", sum(strategy.budgets("prefill")) / L)
