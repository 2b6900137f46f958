"""An independent oracle for the runtime: keep the FULL cache and mask the evicted tokens.

It shares no code with ``polykv_search.runtime`` or the fast patterns but the one statement of the
eviction rule (``eviction_target``: when, and down to how many tokens): attention runs over every
token ever seen with a per-(layer, row, head) "kept" mask, and eviction decisions come from slow,
obvious per-row Python reference implementations of each pattern. Same semantics as the spec:
prefill compresses after the layer's kernel; decoding evicts as ``eviction_target`` says; the decoding
pattern also observes the prefill call.
"""

from __future__ import annotations

import hashlib
import math

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from polykv_search.runtime import eviction_target
from strategies import Strategy

NAME = "polykv_oracle"
_ACTIVE: dict[int, Oracle] = {}

DEFAULTS = {
    "full": {},
    "streaming_llm": {"n_sink": 4},
    "h2o": {"recent_ratio": 0.5, "chunk": 512},
    "tova": {},
    "snapkv": {"window": 32, "kernel": 5, "pooling": "avgpool"},
    "pyramidkv": {"window": 8, "kernel": 7, "pooling": "maxpool"},
    "knorm": {},
    "random": {"seed": 0},
    "keydiff": {},
    "expected_attention": {
        "n_future_positions": 512,
        "n_sink": 4,
        "use_covariance": True,
        "use_vnorm": True,
        "epsilon": 0.0,
    },
}


class OracleLayer:
    def __init__(self, idx, prefill, decoding):
        self.idx = idx
        self.plans = {"prefill": prefill, "decoding": decoding}  # (name, params, budget)
        self.kept = None  # [B, H, N] bool over all tokens seen
        self.valid = None  # [B, N] bool
        self.calls = 0
        self.evictions = 0
        self.since = 0
        self.acc = {}  # pattern key -> [B, H, N] float64 accumulated attention
        self.queries = {}  # pattern key -> list of (query [B, Hq, D], position)


def _key(plan):
    name, params, _ = plan
    return name + repr(sorted(params.items()))


class Oracle:
    def __init__(self, model, strategy: Strategy, decode_interval: int = 1, interval_mode: str = "within"):
        self.model = model
        self.interval = decode_interval
        self.mode = interval_mode
        self.layers = []
        for i, (p, d) in enumerate(zip(strategy.prefill, strategy.decoding)):
            mk = lambda c: (c.pattern, {**DEFAULTS[c.pattern], **c.params}, c.budget)  # noqa: E731
            self.layers.append(OracleLayer(i, mk(p), mk(d)))
        self.impl = model.config._attn_implementation
        rotary = model.model.rotary_emb  # RoPE frequencies, applied here with float64 loops
        self.rope = ([float(f) for f in rotary.inv_freq], float(rotary.attention_scaling))

    def __enter__(self):
        AttentionInterface.register(NAME, _oracle_attention)
        AttentionMaskInterface.register(NAME, lambda *, attention_mask=None, **_: attention_mask)
        _ACTIVE[id(self.model.config)] = self
        self.model.set_attn_implementation(NAME)
        return self

    def __exit__(self, *exc):
        self.model.set_attn_implementation(self.impl)
        _ACTIVE.pop(id(self.model.config), None)

    def kept_positions(self, layer: int, b: int, h: int) -> list[int]:
        kept = self.layers[layer].kept[b, h]
        return [i for i in range(kept.shape[0]) if kept[i]]


def _oracle_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    o = _ACTIVE[id(module.config)]
    L = o.layers[module.layer_idx]
    B, Hq, q, D = query.shape
    Hkv, N = key.shape[1], key.shape[2]
    groups = Hq // Hkv
    new_kept = torch.ones(B, Hkv, q, dtype=torch.bool)
    pad = attention_mask[:, -q:].bool() if attention_mask is not None else torch.ones(B, q, dtype=torch.bool)
    L.kept = new_kept if L.kept is None else torch.cat([L.kept, new_kept], -1)
    L.valid = pad if L.valid is None else torch.cat([L.valid, pad], -1)
    for k in L.acc:
        L.acc[k] = torch.cat([L.acc[k], torch.zeros(B, Hkv, q, dtype=torch.float64)], -1)

    qpos = list(range(N - q, N))
    out = torch.zeros(B, q, Hq, D)
    probs_all = torch.zeros(B, Hq, q, N, dtype=torch.float64)
    for b in range(B):
        for hq in range(Hq):
            h = hq // groups
            for i, p in enumerate(qpos):
                allowed = [j for j in range(N) if (L.kept[b, h, j] and L.valid[b, j] and j <= p) or j == p]
                logits = torch.stack([(query[b, hq, i].double() @ key[b, h, j].double()) * scaling for j in allowed])
                w = torch.softmax(logits, 0)
                probs_all[b, hq, i, allowed] = w
                out[b, i, hq] = (w[:, None] * value[b, h, allowed].double()).sum(0).float()

    phase = "prefill" if L.calls == 0 else "decoding"
    observers = ([L.plans["prefill"]] if phase == "prefill" else []) + [L.plans["decoding"]]
    for plan in {(_key(pl)): pl for pl in observers}.values():
        name, params, budget = plan
        if budget is None or name == "full":
            continue
        k = _key(plan)
        if name == "h2o":
            acc = L.acc.setdefault(k, torch.zeros(B, Hkv, N, dtype=torch.float64))
            for b in range(B):
                for hq in range(Hq):
                    for i in range(q):
                        if pad[b, i]:
                            acc[b, hq // groups] += probs_all[b, hq, i]
        if name in ("snapkv", "pyramidkv", "tova"):
            buf = L.queries.setdefault(k, [])
            buf.extend((query[:, :, i].double(), qpos[i]) for i in range(q))
            keep_last = 1 if name == "tova" else params["window"]
            del buf[:-keep_last]
        if name == "expected_attention":  # every query, with its position and whether it is real
            L.queries.setdefault(k, []).extend((query[:, :, i].double(), qpos[i], pad[:, i]) for i in range(q))

    L.calls += 1
    plan = L.plans[phase]
    if phase == "decoding":
        L.since += 1
    name, params, budget = plan
    if name != "full":
        n_kept = int(L.kept[0, 0].sum())
        # the runtime's own statement of when and how far to evict; the selection below stays the oracle's
        target = eviction_target(phase, n_kept, budget, interval=o.interval, mode=o.mode, steps_since_eviction=L.since)
        if target is not None:
            _evict(L, (name, params, target), key, scaling, groups, value=value, rope=o.rope)
            L.evictions += 1
            L.since = 0
    if phase == "prefill":
        L.acc = {k: v for k, v in L.acc.items() if k == _key(L.plans["decoding"])}
        L.queries = {k: v for k, v in L.queries.items() if k == _key(L.plans["decoding"])}
    return out.to(query.dtype), None


def _probs_over(L, key, b, hq, groups, qvec, qp, cands, scaling):
    """Attention of one query over the candidate (kept) tokens, masked like the model."""
    h = hq // groups
    allowed = [j for j in cands if (L.valid[b, j] and j <= qp) or j == qp]
    logits = torch.stack([(qvec @ key[b, h, j].double()) * scaling for j in allowed])
    w = torch.softmax(logits, 0)
    return {j: float(w[allowed.index(j)]) if j in allowed else 0.0 for j in cands}


def _evict(L, plan, key, scaling, groups, value=None, rope=None):
    name, params, budget = plan
    B, Hkv = L.kept.shape[:2]
    Hq = Hkv * groups
    rand = None
    if name == "random":
        n = int(L.kept[0, 0].sum())
        digest = hashlib.sha256(f"{params['seed']}/{L.idx}/{L.evictions}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
        rand = torch.rand((B, Hkv, n), generator=gen)
    if name == "expected_attention":  # the mean RoPE matrix of the next n_future_positions positions
        n, seen, d = params["n_future_positions"], key.shape[2], key.shape[-1]
        ahead = sum(_rotation(p, rope, d) for p in range(seen, seen + n)) / n
    tova_shared = {}
    if name == "tova":
        ((qvec, qp),) = L.queries[_key(plan)]
        for b in range(B):
            cands = [j for j in range(L.kept.shape[-1]) if L.kept[b, 0, j]]
            per_head = [_probs_over(L, key, b, hq, groups, qvec[b, hq], qp, cands, scaling) for hq in range(Hq)]
            tova_shared[b] = {j: sum(ph[j] for ph in per_head) / Hq for j in cands}
    for b in range(B):
        for h in range(Hkv):
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
                score = {j: float(rand[b, h, i]) for i, j in enumerate(cands)}
            elif name == "keydiff":
                score = _keydiff(key, b, h, cands, valid)
            elif name == "expected_attention":
                sinks = valid[: params["n_sink"]]
                group = range(h * groups, (h + 1) * groups)
                stats = {hq: _query_stats(L.queries[_key(plan)], b, hq, params, rope, ahead) for hq in group}
                score = _expected_attention(key, value, b, h, groups, cands, valid, sinks, stats, params)
                protected = set(valid[: min(params["n_sink"], budget)])
            elif name == "h2o":
                acc = L.acc[_key(plan)]
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
                    for qvec, qp in L.queries[_key(plan)]:
                        pr = _probs_over(L, key, b, hq, groups, qvec[b, hq], qp, cands, scaling)
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

            # protected first, then by score (ties: older first), padding last
            def rank(j):
                tier = 2 if j in protected else (1 if L.valid[b, j] else 0)
                return (-tier, -score[j] if tier == 1 else 0.0)

            order = sorted(cands, key=rank)  # stable: equal keys keep position order
            keep = set(order[:budget])
            for j in cands:
                if j not in keep:
                    L.kept[b, h, j] = False
        if name == "tova":
            assert all(torch.equal(L.kept[b, 0], L.kept[b, hh]) for hh in range(Hkv))


def _unit(vec):
    norm = math.sqrt(sum(float(x) ** 2 for x in vec))
    return [float(x) / max(norm, 1e-12) for x in vec]


def _keydiff(key, b, h, cands, valid):
    """KeyDiff: minus the cosine of each key to the mean unit key of the real cached tokens."""
    units = {j: _unit(key[b, h, j].double()) for j in cands}
    d = key.shape[-1]
    anchor = [sum(units[j][i] for j in valid) / max(len(valid), 1) for i in range(d)]
    a = _unit(anchor)
    return {j: -sum(u * x for u, x in zip(units[j], a)) for j in cands}


def _rotation(p, rope, d):
    """The RoPE matrix of position ``p`` (pairs ``(i, i + d/2)`` rotated by ``p * freq_i``), float64."""
    freqs, scale = rope
    r = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        c, s = math.cos(p * freqs[i]) * scale, math.sin(p * freqs[i]) * scale
        j = i + d // 2
        r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def _query_stats(queries, b, hq, params, rope, ahead):
    """Mean and covariance of row ``b``'s pre-RoPE queries of head ``hq`` past its first ``n_sink`` real
    tokens, rotated by ``ahead`` (the mean RoPE matrix of the next ``n_future_positions`` positions)."""
    d = queries[0][0].shape[-1]
    pre, rank = [], 0
    for qvec, qp, real in queries:
        if not real[b]:
            continue
        if rank >= params["n_sink"]:
            pre.append(torch.linalg.solve(_rotation(qp, rope, d), qvec[b, hq]))  # undo the model's RoPE
        rank += 1
    mu = sum(pre) / len(pre) if pre else torch.zeros(d, dtype=torch.float64)
    cov = torch.zeros(d, d, dtype=torch.float64)
    for x in pre:
        cov += torch.outer(x - mu, x - mu) / len(pre)
    return ahead @ mu, (ahead @ cov @ ahead.T if params["use_covariance"] else None)


def _expected_attention(key, value, b, h, groups, cands, valid, sinks, stats, params):
    """Expected attention of the rotated query Gaussian of each head of the group, softmax over the
    real non-sink tokens, group mean, times the value norm; sinks and padding score 0."""
    scored = [j for j in valid if j not in sinks]
    d = key.shape[-1]
    total = {j: 0.0 for j in scored}
    for hq in range(h * groups, (h + 1) * groups):
        mu, cov = stats[hq]
        logit = {}
        for j in scored:
            k = key[b, h, j].double()
            logit[j] = float(mu @ k) / math.sqrt(d) + (float(k @ cov @ k) / d / 2 if cov is not None else 0.0)
        top = max(logit.values(), default=0.0)
        z = sum(math.exp(x - top) for x in logit.values())
        for j in scored:
            total[j] += math.exp(logit[j] - top) / z / groups
    score = {j: 0.0 for j in cands}
    for j in scored:
        vnorm = math.sqrt(sum(float(x) ** 2 for x in value[b, h, j]))
        score[j] = (total[j] + params["epsilon"]) * vnorm if params["use_vnorm"] else total[j]
    return score
