"""kvzip's pooled allocations (``allocation`` "layer" / "model") written out for the oracle, from the
module docstring of ``polykv_search.runtime.pooled`` as a spec, sharing no code with it.

A pool is the layers whose plan in this phase is the same kvzip plan ("model") or the layer alone ("layer");
it holds ``C = sum(H * budget)`` tokens over its ``P`` (layer, KV head) cells. Per row: the sinks (the first
``min(n_sink, budget)`` real prompt tokens of every cell, and with a protected boundary its last
``min(boundary, budget - n_sink)``) always; the tokens appended since the prompt, ``a`` per cell, all of
them while ``C - S >= P * a`` (``S``: the sinks, and with ``evidence`` each cell's share of its best prompt
tokens, as in ``tests/oracle_evidence.py``), else the newest ``(C - S) // P`` per cell; and the best
remaining prompt tokens of the whole pool, ``C - S - P * a`` of them, best pass score first, ties to the
lower layer, then the lower head, then the older token.

A pool prior (kvzip's ``weight``, ``floor``, ``cap``, per layer, or per KV head as a list with one value per KV head
of the layer, ``h``-th for head ``h``): plans differing only in them share one pool.
A cell's *order* is its sinks (and boundary), oldest first, then its other prompt tokens still held, best score
first, older first on ties. Its first ``min(floor, budget)`` tokens in that order that are not sinks come before
every other prompt token of the pool; its tokens past its first ``cap`` in that order that are not sinks are never
kept (cap 0: none); the prompt tokens of the pool are ranked by ``score * weight`` in float64 after that.
"""

from __future__ import annotations

from tests.oracle_evidence import top_share

PRIOR = {"weight": 1.0, "floor": 0, "cap": 0}


def pooled(plan) -> bool:
    name, params, _ = plan
    return name == "kvzip" and params.get("allocation", "head") != "head"


def pooled_evict(o, L, phase: str, plan, heads=None) -> None:
    """Set the kept tokens of layer ``L``'s KV ``heads`` (all when None) by the pool rule, ``plan`` being
    their ``phase`` plan. The pool's cells are the (layer, KV head) pairs whose head group has the same
    pattern and params but the prior in this phase (in every layer for "model", in ``L`` for "layer"), each
    with its group's budget and prior."""
    name, params, _ = plan
    layers = o.layers if params["allocation"] == "model" else [L]
    members = [
        (M, h, part["plans"][phase])
        for M in layers
        for part in M.parts
        if part["plans"][phase][0] == name and _identity(part["plans"][phase][1]) == _identity(params)
        for h in part["heads"]
    ]
    B, H, N = L.kept.shape
    n_prompt = L.zip[name + repr(sorted(params.items()))].shape[-1]
    appended = list(range(n_prompt, N))
    capacity = sum(budget for _, _, (_, _, budget) in members)
    cells = len(members)
    for b in range(B):
        prompt = [j for j in range(n_prompt) if L.valid[b, j]]
        sinks, first, never = {}, set(), set()
        for M, h, (_, p, budget) in members:
            z = M.zip[name + repr(sorted(p.items()))]
            protected = set(prompt[: min(p["n_sink"], budget)]) | prompt_end(L, b, n_prompt, p, budget)
            held = [j for j in prompt if M.kept[b, h, j]]  # the evidence share: the best held tokens, protected too
            protected |= top_share(
                {j: float(z[b, h, j]) for j in held}, held, protected, p.get("evidence", 0.0), budget
            )
            held = [j for j in held if j not in protected]
            rest = sorted(held, key=lambda j: (-float(z[b, h, j]), j))
            order = sorted(protected) + rest
            sinks[M.idx, h] = protected
            first |= {(M.idx, h, j) for j in order[: min(at(p, "floor", h), budget)] if j not in protected}
            if at(p, "cap", h):
                never |= {(M.idx, h, j) for j in order[at(p, "cap", h) :] if j not in protected}
        n_sinks = sum(len(s) for s in sinks.values())
        if capacity - n_sinks >= cells * len(appended):
            kept_appended, rest = appended, capacity - n_sinks - cells * len(appended)
        else:
            per_cell = max(0, (capacity - n_sinks) // cells)
            kept_appended, rest = appended[len(appended) - per_cell :] if per_cell else [], 0
        others = [
            (
                (M.idx, h, j) not in first,
                -float(M.zip[name + repr(sorted(p.items()))][b, h, j]) * float(at(p, "weight", h)),
                M.idx,
                h,
                j,
            )
            for M, h, (_, p, _) in members
            for j in prompt
            if j not in sinks[M.idx, h] and M.kept[b, h, j] and (M.idx, h, j) not in never
        ]
        best = {(m, h, j) for _, _, m, h, j in sorted(others)[:rest]}
        for h in range(H) if heads is None else heads:
            for j in range(N):
                keep = j in sinks[L.idx, h] or j in kept_appended or (L.idx, h, j) in best
                L.kept[b, h, j] = bool(L.kept[b, h, j]) and keep


def at(params, key: str, head: int):
    """The prior ``key`` of KV ``head``: the plan's value, or its ``head``-th entry when it is a list (per head)."""
    value = params.get(key, PRIOR[key])
    return value[head] if isinstance(value, (list, tuple)) else value


def _identity(params) -> dict:
    """A plan's params without its pool prior (the pool it joins)."""
    return {**params, **PRIOR}


def prompt_end(L, b: int, n_prompt: int, params, budget: int) -> set[int]:
    """kvzip's protected prompt boundary in row ``b``: its last ``min(boundary, budget - n_sink)`` real prompt
    tokens (their slots among the first ``n_prompt``)."""
    k = min(params.get("boundary", 0), max(0, budget - params["n_sink"]))
    prompt = [j for j in range(n_prompt) if L.valid[b, j]]
    return set(prompt[len(prompt) - k :]) if k > 0 else set()
