"""kvzip's pooled allocations (``allocation`` "layer" / "model") written out for the oracle, from the
module docstring of ``polykv_search.runtime.pooled`` as a spec, sharing no code with it.

A pool is the layers whose plan in this phase is the same kvzip plan ("model") or the layer alone ("layer");
it holds ``C = sum(H * budget)`` tokens over its ``P`` (layer, KV head) cells. Per row: the sinks (the first
``min(n_sink, budget)`` real prompt tokens of every cell) always; the tokens appended since the prompt,
``a`` per cell, all of them while ``C - S >= P * a`` (``S``: the sinks), else the newest
``(C - S) // P`` per cell; and the best remaining prompt tokens of the whole pool, ``C - S - P * a`` of them,
best pass score first, ties to the lower layer, then the lower head, then the older token.
"""

from __future__ import annotations


def pooled(plan) -> bool:
    name, params, _ = plan
    return name == "kvzip" and params.get("allocation", "head") != "head"


def pooled_evict(o, L, phase: str, plan) -> None:
    """Set layer ``L``'s kept tokens by the pool rule, ``plan`` being its ``phase`` plan."""
    name, params, _ = plan
    if params["allocation"] == "model":
        members = [M for M in o.layers if any(part["plans"][phase][:2] == plan[:2] for part in M.parts)]
    else:
        members = [L]
    zip_key = name + repr(sorted(params.items()))
    B, H, N = L.kept.shape
    n_prompt = L.zip[zip_key].shape[-1]
    appended = list(range(n_prompt, N))
    budgets = {M.idx: next(p["plans"][phase][2] for p in M.parts) for M in members}
    capacity = sum(H * b for b in budgets.values())
    cells = H * len(members)
    for b in range(B):
        prompt = [j for j in range(n_prompt) if L.valid[b, j]]
        sinks = {M.idx: prompt[: min(params["n_sink"], budgets[M.idx])] for M in members}
        n_sinks = sum(H * len(s) for s in sinks.values())
        if capacity - n_sinks >= cells * len(appended):
            kept_appended, rest = appended, capacity - n_sinks - cells * len(appended)
        else:
            per_cell = max(0, (capacity - n_sinks) // cells)
            kept_appended, rest = appended[len(appended) - per_cell :] if per_cell else [], 0
        others = [
            (-float(M.zip[zip_key][b, h, j]), M.idx, h, j)
            for M in members
            for h in range(H)
            for j in prompt
            if j not in sinks[M.idx] and M.kept[b, h, j]
        ]
        best = {(m, h, j) for _, m, h, j in sorted(others)[:rest]}
        for h in range(H):
            for j in range(N):
                keep = j in sinks[L.idx] or j in kept_appended or (L.idx, h, j) in best
                L.kept[b, h, j] = bool(L.kept[b, h, j]) and keep
