"""The oracle's selection: which tokens each pattern keeps when a layer's KV heads evict, written out per row
and head in slow, obvious Python (``tests/oracle.py`` runs the model over the full cache and calls
:func:`evict` where the runtime would evict); the patterns' default parameters, as the oracle states them.

It shares no code with ``polykv_search.patterns``: a pattern's scores come from the attention probabilities,
queries and keys the oracle recorded, ranked protected tokens first, then by score (ties: older first).
"""

from __future__ import annotations

import hashlib
import math

import torch

from tests.oracle_evidence import top_share
from tests.oracle_pooled import PRIOR, prompt_end
from tests.oracle_scores import expected_attention_scores, keydiff_scores, query_stats, rotation

DEFAULTS = {
    "full": {},
    "streaming_llm": {"n_sink": 4},
    "h2o": {"recent_ratio": 0.5, "chunk": 128},
    "tova": {},
    "snapkv": {"window": 32, "kernel": 5, "pooling": "avgpool"},
    "pyramidkv": {"window": 8, "kernel": 7, "pooling": "maxpool"},
    "knorm": {},
    "random": {"seed": 0},
    "keydiff": {},
    "kvzip": {
        "n_sink": 4,
        "chunk_size": 2048,
        "query_chunk": 256,
        "allocation": "head",
        "boundary": 0,
        "plus": False,
        "evidence": 0.0,
        **PRIOR,
    },
    "evidence": {"share": 0.5, "rule": "tova", "window": 32, "kernel": 5, "pooling": "avgpool"},
    "expected_attention": {
        "n_future_positions": 512,
        "n_sink": 4,
        "use_covariance": True,
        "use_vnorm": True,
        "epsilon": 0.0,
    },
}


def plan_key(plan):
    name, params, _ = plan
    return name + repr(sorted(params.items()))


def probs_over(L, key, b, hq, groups, qvec, qp, cands, scaling):
    """Attention of one query over the candidate (kept) tokens, masked like the model."""
    h = hq // groups
    allowed = [j for j in cands if (L.valid[b, j] and j <= qp) or j == qp]
    logits = torch.stack([(qvec @ key[b, h, j].double()) * scaling for j in allowed])
    w = torch.softmax(logits, 0)
    return {j: float(w[allowed.index(j)]) if j in allowed else 0.0 for j in cands}


def evict(L, plan, key, scaling, groups, value=None, rope=None, heads=None, n_ev=0):
    """Evict the KV heads ``heads`` (default all) of layer ``L`` to ``plan``'s budget (``n_ev``: the
    group's evictions so far, for seeded draws)."""
    name, params, budget = plan
    kept_budget, share = budget, None
    if name == "evidence":  # the rule at the budget less the share, then the share's best prompt tokens
        share = (params["share"], L.evidence[plan_key(plan)])
        name, budget = params["rule"], budget - math.floor(params["share"] * budget)
        params = DEFAULTS[name]
    B, Hkv = L.kept.shape[:2]
    heads = list(range(Hkv)) if heads is None else list(heads)
    qheads = [h * groups + i for h in heads for i in range(groups)]
    rand = None
    if name == "random":
        n = int(L.kept[0, heads[0]].sum())
        digest = hashlib.sha256(f"{params['seed']}/{L.idx}/{n_ev}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
        rand = torch.rand((B, len(heads), n), generator=gen)
    if name == "expected_attention":  # the mean RoPE matrix of the next n_future_positions positions
        n, seen, d = params["n_future_positions"], key.shape[2], key.shape[-1]
        ahead = sum(rotation(p, rope, d) for p in range(seen, seen + n)) / n
    tova_shared, aligned = {}, {}
    if name == "tova":  # a token's score: each query head's attention over its own tokens (0 if not held), mean
        ((qvec, qp),) = L.queries[plan_key(plan)]
        for b in range(B):
            aligned[b] = all(torch.equal(L.kept[b, heads[0]], L.kept[b, hh]) for hh in heads)
            held = [[j for j in range(L.kept.shape[-1]) if L.kept[b, hq // groups, j]] for hq in qheads]
            per_head = [probs_over(L, key, b, hq, groups, qvec[b, hq], qp, c, scaling) for hq, c in zip(qheads, held)]
            tova_shared[b] = {j: sum(ph.get(j, 0.0) for ph in per_head) / len(qheads) for c in held for j in c}
    for b in range(B):
        for h in heads:
            cands = [j for j in range(L.kept.shape[-1]) if L.kept[b, h, j]]
            valid = [j for j in cands if L.valid[b, j]]
            score = {}
            protected = set()
            if name == "streaming_llm":
                s = min(params["n_sink"], budget)
                protected = set(valid[:s]) | set(valid[len(valid) - (budget - s) :] if budget - s > 0 else [])
                score = {j: 0.0 for j in cands}
            elif name == "knorm":
                score = {j: -math.sqrt(sum(float(x) ** 2 for x in key[b, h, j])) for j in cands}
            elif name == "random":
                score = {j: float(rand[b, heads.index(h), i]) for i, j in enumerate(cands)}
            elif name == "keydiff":
                score = keydiff_scores(key, b, h, cands, valid)
            elif name == "kvzip":  # the pass's max attention; tokens after the prompt: above it, newest first
                z = L.zip[plan_key(plan)]
                n_seen = key.shape[2]
                top = max(1.0, float(z.max()))  # appended tokens above every prompt token (KVzip+: not probabilities)
                score = {j: float(z[b, h, j]) if j < z.shape[-1] else 2 * top + j / (n_seen + 1) for j in cands}
                protected = set(valid[: min(params["n_sink"], budget)]) | prompt_end(L, b, z.shape[-1], params, budget)
                prompt = [j for j in valid if j < z.shape[-1]]
                protected |= top_share(score, prompt, protected, params["evidence"], budget)
            elif name == "expected_attention":
                sinks = valid[: params["n_sink"]]
                group = range(h * groups, (h + 1) * groups)
                stats = {hq: query_stats(L.queries[plan_key(plan)], b, hq, params, rope, ahead) for hq in group}
                score = expected_attention_scores(key, value, b, h, groups, cands, valid, sinks, stats, params)
                protected = set(valid[: min(params["n_sink"], budget)])
            elif name == "h2o":
                acc = L.acc[plan_key(plan)]
                score = {j: float(acc[b, h, j]) for j in cands}
                r = min(int(budget * params["recent_ratio"]), budget)
                protected = set(valid[len(valid) - r :]) if r > 0 else set()
            elif name == "tova":
                score = tova_shared[b]
            elif name in ("snapkv", "pyramidkv"):
                w = params["window"]
                window = set(valid[len(valid) - min(w, len(valid)) :])
                per_head = []
                for hq in range(h * groups, (h + 1) * groups):
                    v = [0.0] * len(cands)
                    for qvec, qp in L.queries[plan_key(plan)]:
                        pr = probs_over(L, key, b, hq, groups, qvec[b, hq], qp, cands, scaling)
                        for i, j in enumerate(cands):
                            v[i] += pr[j]
                    v = [0.0 if cands[i] in window else x for i, x in enumerate(v)]
                    k = params["kernel"]
                    pooled = []
                    for i in range(len(v)):
                        neigh = [v[t] if 0 <= t < len(v) else 0.0 for t in range(i - k // 2, i + k // 2 + 1)]
                        pooled.append(sum(neigh) / k if params["pooling"] == "avgpool" else max(neigh))
                    per_head.append(pooled)
                score = {j: sum(ph[i] for ph in per_head) / groups for i, j in enumerate(cands)}
                protected = set(valid[len(valid) - min(w, budget) :]) if budget > 0 else set()

            if share is not None:
                # tova's heads share one selection: so does the share, by the mean over the heads it evicts together
                ev = share[1][b, heads].mean(0) if name == "tova" else share[1][b, h]
                prompt = [j for j in valid if j < ev.shape[-1]]
                protected |= top_share({j: float(ev[j]) for j in prompt}, prompt, protected, share[0], kept_budget)

            # protected first, then by score (ties: older first), padding last
            def rank(j):
                tier = 2 if j in protected else (1 if L.valid[b, j] else 0)
                return (-tier, -score[j] if tier == 1 else 0.0)

            order = sorted(cands, key=rank)  # stable: equal keys keep position order
            keep = set(order[:kept_budget])
            for j in cands:
                if j not in keep:
                    L.kept[b, h, j] = False
        if name == "tova" and share is None and aligned[b]:  # heads that held the same tokens keep the same
            assert all(torch.equal(L.kept[b, heads[0]], L.kept[b, hh]) for hh in heads)
