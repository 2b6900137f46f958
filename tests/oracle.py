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
from tests.oracle_evidence import prompt_scores, top_share
from tests.oracle_pooled import PRIOR, pooled, pooled_evict, prompt_end
from tests.oracle_scores import expected_attention_scores, keydiff_scores, kvzip_plus_weights, query_stats, rotation

NAME = "polykv_oracle"
_ACTIVE: dict[int, Oracle] = {}

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


class OracleLayer:
    def __init__(self, idx, parts):
        self.idx = idx
        # head groups: KV heads, their plans (name, params, budget) per phase, and their own eviction counters
        self.parts = [
            {"heads": list(h), "plans": {"prefill": p, "decoding": d}, "since": 0, "evictions": 0} for h, p, d in parts
        ]
        self.kept = None  # [B, H, N] bool over all tokens seen
        self.valid = None  # [B, N] bool
        self.calls = 0
        self.acc = {}  # pattern key -> [B, H, N] float64 accumulated attention
        self.zip = {}  # kvzip plan key -> [B, H, n_prompt] float64 max reconstruction attention
        self.deferred = None  # (key, value, scaling, groups) of a prefill call awaiting the kvzip pass
        self.queries = {}  # pattern key -> list of (query [B, Hq, D], position)
        self.evidence = {}  # evidence plan key -> [B, H, n_prompt] float64 prompt scores

    def all_plans(self, phase=None):
        return [part["plans"][ph] for part in self.parts for ph in ([phase] if phase else ["prefill", "decoding"])]


def _key(plan):
    name, params, _ = plan
    return name + repr(sorted(params.items()))


class Oracle:
    def __init__(
        self, model, strategy: Strategy, decode_interval: int = 1, interval_mode: str = "within", head_groups=None
    ):
        """``head_groups``: layer -> [(KV heads, prefill LayerChoice, decoding LayerChoice)] for layers split
        into head groups (the strategy's choice for those layers is not used)."""
        self.model = model
        self.interval = decode_interval
        self.mode = interval_mode
        self.layers = []
        mk = lambda c: (c.pattern, {**DEFAULTS[c.pattern], **c.params}, c.budget)  # noqa: E731
        hkv = model.config.num_key_value_heads
        head_groups = head_groups or {}
        for i, (p, d) in enumerate(zip(strategy.prefill, strategy.decoding)):
            parts = head_groups.get(i, [(range(hkv), p, d)])
            self.layers.append(OracleLayer(i, [(h, mk(pc), mk(dc)) for h, pc, dc in parts]))
        self.impl = model.config._attn_implementation
        rotary = model.model.rotary_emb  # RoPE frequencies, applied here with float64 loops
        self.rope = ([float(f) for f in rotary.inv_freq], float(rotary.attention_scaling))
        # kvzip: every layer defers its prefill eviction until the reconstruction pass has run
        self.kvzip = any(pl[0] == "kvzip" for L in self.layers for pl in L.all_plans())
        self.in_pass = None  # the prompt length while the pass runs
        self.pass_inputs = {}  # during the pass: layer -> [B, q] norms of the attention's input hidden states
        self.prompt = None  # (input_ids, attention_mask) of the first call

    def __enter__(self):
        AttentionInterface.register(NAME, _oracle_attention)
        AttentionMaskInterface.register(NAME, lambda *, attention_mask=None, **_: attention_mask)
        _ACTIVE[id(self.model.config)] = self
        self.model.set_attn_implementation(NAME)
        self._hooks = []
        if self.kvzip:
            self._hooks = [
                self.model.register_forward_pre_hook(self._record, with_kwargs=True),
                self.model.register_forward_hook(self._after),
            ]
        return self

    def __exit__(self, *exc):
        self.model.set_attn_implementation(self.impl)
        _ACTIVE.pop(id(self.model.config), None)
        for hook in self._hooks:
            hook.remove()

    def _record(self, module, args, kwargs):
        if self.prompt is None:
            ids = args[0] if args else kwargs["input_ids"]
            self.prompt = (ids, kwargs.get("attention_mask"))

    def _after(self, module, args, output):
        if self.layers[0].deferred is not None:
            self._reconstruction_pass(output.cache)

    def _reconstruction_pass(self, cache):
        """KVzip's pass, written out: per chunk of the prompt, each row's repeat prompt and real prompt
        tokens (left-padded), attending over the whole cache; then the cache is cut back to the prompt."""
        inputs = self.model.polykv_reconstruction
        ids, mask = self.prompt
        B, n = ids.shape
        mask = torch.ones_like(ids) if mask is None else mask
        size = min(pl[1]["chunk_size"] for L in self.layers for pl in L.all_plans() if pl[0] == "kvzip")
        real = [[int(t) for t, m in zip(ids[b], mask[b]) if m] for b in range(B)]
        self.in_pass = n
        self.pass_inputs = {}  # layer -> [B, q] norms of the attention module's input hidden states

        def record_input(module, args, kwargs):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            self.pass_inputs[module.layer_idx] = x.double().norm(dim=-1)

        attns = [layer.self_attn for layer in self.model.model.layers]
        hooks = [attn.register_forward_pre_hook(record_input, with_kwargs=True) for attn in attns]
        for start in range(0, n, size):
            rows = []
            for b in range(B):
                pad = n - len(real[b])
                lo, hi = max(0, start - pad), max(0, min(start + size, n) - pad)
                head = (
                    list(inputs.first) if start == 0 else list(inputs.later) + real[b][max(0, lo - inputs.overlap) : lo]
                )
                rows.append(head + list(inputs.suffix) + real[b][lo:hi])
            width = max(len(r) for r in rows)
            x = torch.zeros(B, width, dtype=torch.long)
            m = torch.cat([mask, torch.zeros(B, width, dtype=mask.dtype)], 1)
            for b, r in enumerate(rows):
                x[b, width - len(r) :] = torch.tensor(r)
                m[b, n + width - len(r) :] = 1
            self.model.model(input_ids=x, attention_mask=m, cache=cache, use_cache=True)
            cache.crop(-width)
        for hook in hooks:
            hook.remove()
        self.in_pass = None
        for L in self.layers:
            key, value, scaling, groups = L.deferred
            L.deferred = None
            _end_call(self, L, "prefill", key, value, scaling, groups)

    def kept_positions(self, layer: int, b: int, h: int) -> list[int]:
        kept = self.layers[layer].kept[b, h]
        return [i for i in range(kept.shape[0]) if kept[i]]


def _oracle_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    o = _ACTIVE[id(module.config)]
    L = o.layers[module.layer_idx]
    B, Hq, q, D = query.shape
    n_prompt = o.in_pass
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

    if n_prompt is not None:  # a reconstruction call: fold the max attention to the prompt, cut back
        for plan in [pl for pl in L.all_plans() if pl[0] == "kvzip" and pl[2] is not None]:
            z = L.zip.setdefault(_key(plan), torch.zeros(B, Hkv, n_prompt, dtype=torch.float64))
            for b in range(B):
                for hq in range(Hq):
                    for i in range(q):
                        if pad[b, i]:
                            a = probs_all[b, hq, i, :n_prompt]
                            if plan[1]["plus"]:  # KVzip+: a * ||v W_o[hq]|| / ||x||, x the attention's input
                                a = a * kvzip_plus_weights(module, value, b, hq, groups, n_prompt)
                                a = a / float(o.pass_inputs[module.layer_idx][b, i])
                            z[b, hq // groups] = torch.maximum(z[b, hq // groups], a)
        L.kept, L.valid = L.kept[..., :n_prompt], L.valid[..., :n_prompt]
        L.acc = {k: v[..., :n_prompt] for k, v in L.acc.items()}
        return out.to(query.dtype), None

    phase = "prefill" if L.calls == 0 else "decoding"
    observers = (L.all_plans("prefill") if phase == "prefill" else []) + L.all_plans("decoding")
    for plan in {(_key(pl)): pl for pl in observers}.values():
        name, params, budget = plan
        if budget is None or name == "full":
            continue
        k = _key(plan)
        if name == "evidence":  # the prompt's scores at its call; the rule observes under this plan's key
            if phase == "prefill":
                L.evidence[k] = prompt_scores(probs_all, L.valid, params, groups)
            name = params["rule"]
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
    if phase == "prefill" and o.kvzip:
        L.deferred = (key, value, scaling, groups)
    else:
        _end_call(o, L, phase, key, value, scaling, groups)
    return out.to(query.dtype), None


def _end_call(o, L, phase, key, value, scaling, groups):
    for part in L.parts:  # each head group evicts on its own, as the runtime's group layers do
        if phase == "decoding":
            part["since"] += 1
        name, params, budget = part["plans"][phase]
        if name == "full":
            continue
        if pooled(part["plans"][phase]):
            pooled_evict(o, L, phase, part["plans"][phase], part["heads"])
            continue
        n_kept = int(L.kept[0, part["heads"][0]].sum())
        # the runtime's own statement of when and how far to evict; the selection below stays the oracle's
        since = part["since"]
        target = eviction_target(phase, n_kept, budget, interval=o.interval, mode=o.mode, steps_since_eviction=since)
        if target is not None:
            plan = (name, params, target)
            _evict(L, plan, key, scaling, groups, value=value, rope=o.rope, heads=part["heads"], n_ev=part["evictions"])
            part["evictions"] += 1
            part["since"] = 0
    if phase == "prefill":
        keep = {_key(pl) for pl in L.all_plans("decoding")}
        L.acc = {k: v for k, v in L.acc.items() if k in keep}
        L.queries = {k: v for k, v in L.queries.items() if k in keep}


def _probs_over(L, key, b, hq, groups, qvec, qp, cands, scaling):
    """Attention of one query over the candidate (kept) tokens, masked like the model."""
    h = hq // groups
    allowed = [j for j in cands if (L.valid[b, j] and j <= qp) or j == qp]
    logits = torch.stack([(qvec @ key[b, h, j].double()) * scaling for j in allowed])
    w = torch.softmax(logits, 0)
    return {j: float(w[allowed.index(j)]) if j in allowed else 0.0 for j in cands}


def _evict(L, plan, key, scaling, groups, value=None, rope=None, heads=None, n_ev=0):
    """Evict the KV heads ``heads`` (default all) of layer ``L`` to ``plan``'s budget (``n_ev``: the
    group's evictions so far, for seeded draws)."""
    name, params, budget = plan
    kept_budget, share = budget, None
    if name == "evidence":  # the rule at the budget less the share, then the share's best prompt tokens
        share = (params["share"], L.evidence[_key(plan)])
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
        ((qvec, qp),) = L.queries[_key(plan)]
        for b in range(B):
            aligned[b] = all(torch.equal(L.kept[b, heads[0]], L.kept[b, hh]) for hh in heads)
            held = [[j for j in range(L.kept.shape[-1]) if L.kept[b, hq // groups, j]] for hq in qheads]
            per_head = [_probs_over(L, key, b, hq, groups, qvec[b, hq], qp, c, scaling) for hq, c in zip(qheads, held)]
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
                z = L.zip[_key(plan)]
                n_seen = key.shape[2]
                top = max(1.0, float(z.max()))  # appended tokens above every prompt token (KVzip+: not probabilities)
                score = {j: float(z[b, h, j]) if j < z.shape[-1] else 2 * top + j / (n_seen + 1) for j in cands}
                protected = set(valid[: min(params["n_sink"], budget)]) | prompt_end(L, b, z.shape[-1], params, budget)
                prompt = [j for j in valid if j < z.shape[-1]]
                protected |= top_share(score, prompt, protected, params["evidence"], budget)
            elif name == "expected_attention":
                sinks = valid[: params["n_sink"]]
                group = range(h * groups, (h + 1) * groups)
                stats = {hq: query_stats(L.queries[_key(plan)], b, hq, params, rope, ahead) for hq in group}
                score = expected_attention_scores(key, value, b, h, groups, cands, valid, sinks, stats, params)
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
