"""The evidence share written out for the oracle (``kvzip``'s ``evidence`` and the ``evidence`` pattern), from
their docstrings as a spec, sharing no code with ``polykv_search``.

The share: at budget ``b`` a KV head keeps, beside the tokens its rule protects, its ``min(floor(share * b),
b - protected)`` best prompt tokens among those it still holds and does not protect already (best score
first, ties to the older token). The ``evidence`` pattern's prompt score is SnapKV's, from the prompt call:
the attention of its last ``window`` queries, the window's own tokens scoring nothing, pooled over ``kernel``
slots (zero beyond the ends), the mean over the KV head's query heads (for the rule ``tova``, whose heads
share one selection, the mean over the KV heads evicted together, taken where the share is chosen).
"""

from __future__ import annotations

import math

import torch


def top_share(score, candidates, protected: set[int], share: float, budget: int) -> set[int]:
    """The share's tokens: ``score`` maps a prompt slot to its score; ``candidates``: the prompt slots held."""
    count = min(math.floor(share * budget), budget - len(protected))
    ranked = sorted((j for j in candidates if j not in protected), key=lambda j: (-score[j], j))
    return set(ranked[: max(0, count)])


def prompt_scores(probs, valid, params, groups: int) -> torch.Tensor:
    """``[B, Hkv, N]`` float64 evidence scores of a prompt call: ``probs`` ``[B, Hq, q, N]`` its attention,
    ``valid`` ``[B, N]`` its real tokens."""
    B, Hq, q, N = probs.shape
    w, k = params["window"], params["kernel"]
    out = torch.zeros(B, Hq // groups, N, dtype=torch.float64)
    for b in range(B):
        real = [j for j in range(N) if valid[b, j]]
        window = set(real[len(real) - min(w, len(real)) :])
        for hq in range(Hq):
            last = range(q - min(w, q), q)
            votes = [0.0 if j in window else float(sum(probs[b, hq, i, j] for i in last)) for j in range(N)]
            for j in range(N):
                near = [votes[t] if 0 <= t < N else 0.0 for t in range(j - k // 2, j + k // 2 + 1)]
                pooled = sum(near) / k if params["pooling"] == "avgpool" else max(near)
                out[b, hq // groups, j] += pooled / groups
    return out
