"""An independent oracle for the runtime: keep the FULL cache and mask the evicted tokens.

It shares no code with ``polykv_search.runtime`` or the fast patterns but the one statement of the
eviction rule (``eviction_target``: when, and down to how many tokens): attention runs over every
token ever seen with a per-(layer, row, head) "kept" mask, and eviction decisions come from slow,
obvious per-row Python reference implementations of each pattern (``tests/oracle_select.py``; kvzip's
pooled allocations: ``tests/oracle_pooled.py``). Same semantics as the spec: prefill compresses after
the layer's kernel; decoding evicts as ``eviction_target`` says; the decoding pattern also observes the
prefill call.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from polykv_search.runtime import eviction_target
from strategies import Strategy
from tests.oracle_evidence import prompt_scores
from tests.oracle_pooled import pooled, pooled_evict
from tests.oracle_scores import kvzip_plus_weights
from tests.oracle_select import DEFAULTS, evict, plan_key

NAME = "polykv_oracle"
_ACTIVE: dict[int, Oracle] = {}


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
            z = L.zip.setdefault(plan_key(plan), torch.zeros(B, Hkv, n_prompt, dtype=torch.float64))
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
    for plan in {(plan_key(pl)): pl for pl in observers}.values():
        name, params, budget = plan
        if budget is None or name == "full":
            continue
        k = plan_key(plan)
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
            evict(L, plan, key, scaling, groups, value=value, rope=o.rope, heads=part["heads"], n_ev=part["evictions"])
            part["evictions"] += 1
            part["since"] = 0
    if phase == "prefill":
        keep = {plan_key(pl) for pl in L.all_plans("decoding")}
        L.acc = {k: v for k, v in L.acc.items() if k in keep}
        L.queries = {k: v for k, v in L.queries.items() if k in keep}
