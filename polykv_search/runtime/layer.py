"""`EvictingLayer`: one layer's physical KV cache with per-token positions and its eviction plan.

Each cached token carries its absolute sequence index (``positions``) and whether it is a real token
(``valid``: left padding is not), per batch row and KV head, so every layer can hold a different
number of tokens and the runtime still builds an exact per-layer mask. RoPE phases of kept keys are
the ones computed when the token was seen; nothing is re-rotated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin

from polykv_search.patterns.base import Pattern
from polykv_search.patterns.full import Full

PREFILL, DECODING = "prefill", "decoding"


@dataclass(frozen=True)
class PhasePlan:
    """The pattern and budget a layer applies in one phase (``budget=None``: keep all)."""

    pattern: Pattern
    budget: int | None

    @property
    def evicts(self) -> bool:
        return self.budget is not None and not self.pattern.keeps_all


#: The no-eviction plan.
FULL_PLAN = PhasePlan(Full(), None)


class EvictingLayer(CacheLayerMixin):
    """A dynamic cache layer that shrinks itself to its budget after the attention kernel.

    The runtime calls, per attention call: :meth:`begin_call` (marks padding, sets query positions),
    then the hook points of the observing patterns, then :meth:`end_call` (evicts when over budget).
    ``get_seq_length`` reports tokens *seen*, so ``generate()`` keeps absolute positions.
    """

    is_sliding = False
    is_croppable = False

    def __init__(
        self,
        layer_idx: int,
        prefill: PhasePlan,
        decoding: PhasePlan,
        *,
        num_kv_heads: int,
        groups: int,
        scaling: float,
        sliding_window: int | None = None,
        decode_interval: int = 1,
        on_update=None,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.plans = {PREFILL: prefill, DECODING: decoding}
        self.num_kv_heads = num_kv_heads
        self.groups = groups
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.decode_interval = decode_interval
        self._on_update = on_update
        self.reset()

    # ------------------------------------------------------- CacheLayerMixin API
    def reset(self) -> None:
        self.keys = self.values = None
        self.positions: torch.Tensor | None = None  # [B, Hkv, n] int64 sequence index
        self.valid: torch.Tensor | None = None  # [B, Hkv, n] bool
        self.is_initialized = False
        self.seen = 0
        self.calls = 0
        self.num_evictions = 0
        self.steps_since_eviction = 0
        self.query_positions: torch.Tensor | None = None
        self.states: dict[Pattern, dict[str, Any]] = {}

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, _ = key_states.shape
        self.device = key_states.device
        self.keys = key_states[:, :, :0]
        self.values = value_states[:, :, :0]
        self.positions = torch.zeros(b, h, 0, dtype=torch.long, device=self.device)
        self.valid = torch.zeros(b, h, 0, dtype=torch.bool, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, h, q, _ = key_states.shape
        new_pos = torch.arange(self.seen, self.seen + q, device=self.device)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self.positions = torch.cat([self.positions, new_pos.expand(b, h, q)], dim=-1)
        self.valid = torch.cat([self.valid, torch.ones(b, h, q, dtype=torch.bool, device=self.device)], dim=-1)
        self.seen += q
        if self._on_update is not None:
            self._on_update(self)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("an evicting cache cannot be cropped (assisted/speculative decoding is not supported)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices])

    # ------------------------------------------------------------ runtime side
    @property
    def length(self) -> int:
        """Tokens physically held per (batch row, KV head)."""
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def phase(self) -> str:
        """The phase of the call in progress: the first call of a layer is its prefill."""
        return PREFILL if self.calls == 0 else DECODING

    def observers(self) -> list[tuple[Pattern, dict]]:
        """Patterns that watch this call: the prefill pattern during prefill, and always the decoding
        pattern (so that, e.g., H2O decoding has the prompt's accumulated attention). Identical
        patterns share one state."""
        plans = [self.plans[PREFILL]] if self.calls == 0 else []
        plans.append(self.plans[DECODING])
        seen: dict[Pattern, dict] = {}
        for plan in plans:
            if plan.evicts and plan.pattern not in seen:
                seen[plan.pattern] = self.states.setdefault(plan.pattern, {})
        return list(seen.items())

    def begin_call(self, q_len: int, padding_mask: torch.Tensor | None) -> None:
        """Mark this call's padding tokens invalid and record the query positions."""
        self.query_positions = torch.arange(self.seen - q_len, self.seen, device=self.device)
        if padding_mask is not None:
            new_valid = padding_mask[:, self.seen - q_len : self.seen].to(torch.bool)
            self.valid[..., -q_len:] = new_valid[:, None, :]

    def end_call(self) -> None:
        """Evict down to the phase's budget when over it (decoding: every ``decode_interval`` steps)."""
        phase = self.phase
        self.calls += 1
        plan = self.plans[phase]
        if phase == DECODING:
            self.steps_since_eviction += 1
        if plan.evicts and self.length > plan.budget:
            if phase == PREFILL or self.steps_since_eviction >= self.decode_interval:
                self.evict(plan)
        if phase == PREFILL:
            decoding = self.plans[DECODING].pattern
            self.states = {k: v for k, v in self.states.items() if k == decoding}

    def evict(self, plan: PhasePlan) -> None:
        state = self.states.setdefault(plan.pattern, {})
        keep = plan.pattern.cache_update(self, state, plan.budget)  # [B, Hkv, b]
        self.keys = _gather_tokens(self.keys, keep)
        self.values = _gather_tokens(self.values, keep)
        self.positions = self.positions.gather(-1, keep)
        self.valid = self.valid.gather(-1, keep)
        for st in self.states.values():
            for name, tensor in st.get("token", {}).items():
                st["token"][name] = tensor.gather(-1, keep)
        self.num_evictions += 1
        self.steps_since_eviction = 0

    # ------------------------------------------------------- helpers for patterns
    def allowed(self, query_positions: torch.Tensor) -> torch.Tensor:
        """Bool mask broadcastable to ``[B, Hkv, q, n]``: which cached keys each query may attend to.

        Before any eviction and without padding, every row and head holds positions ``0..n-1``, so the
        mask is one ``[1, 1, q, n]`` causal (and sliding-window) pattern shared by all of them.
        """
        if self.num_evictions == 0 and bool(self.valid.all()):
            kpos = torch.arange(self.positions.shape[-1], device=self.device)[None, :]
            qpos = query_positions.to(self.device)[:, None]
            allowed = kpos <= qpos
            if self.sliding_window is not None:
                allowed &= (qpos - kpos) < self.sliding_window
            return allowed[None, None]
        kpos = self.positions[:, :, None, :]
        qpos = query_positions.to(self.device)[None, None, :, None]
        allowed = self.valid[:, :, None, :] & (kpos <= qpos)
        if self.sliding_window is not None:
            allowed &= (qpos - kpos) < self.sliding_window
        # A padding query sees only itself, so no row is empty and no NaN can leak into the cache.
        return allowed | (kpos == qpos)

    def repeat_heads(self, t: torch.Tensor) -> torch.Tensor:
        """Expand a KV-head tensor ``[B, Hkv, ...]`` to query heads ``[B, Hq, ...]``."""
        return t if self.groups == 1 else t.repeat_interleave(self.groups, dim=1)

    def group_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Reduce a query-head tensor ``[B, Hq, n]`` to KV heads by summing over each GQA group."""
        b, hq = t.shape[:2]
        return t.reshape(b, hq // self.groups, self.groups, *t.shape[2:]).sum(dim=2)

    def group_mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.group_sum(t) / self.groups

    def attention_probs(self, query: torch.Tensor, query_positions: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        """Softmax attention ``[B, Hq, q, n]`` (fp32) of ``query`` over the cached keys.

        ``upto``: only the first ``upto`` cached tokens (``[B, Hq, q, upto]``); exact when no query may
        see a later one (see :meth:`visible_prefix`), since masked keys get probability 0 anyway.
        """
        b, hq, q, d = query.shape
        h, g = self.num_kv_heads, self.groups
        keys = self.keys if upto is None else self.keys[..., :upto, :]
        n = keys.shape[-2]
        # Group the query heads of each KV head instead of copying K per query head.
        # the scale goes on the (small) queries, not on the [q, n] logits: one pass less over them
        scaled = query.float().reshape(b, h, g * q, d) * self.scaling
        logits = torch.matmul(scaled, keys.float().transpose(-1, -2)).view(b, h, g, q, n)
        mask = self.allowed(query_positions)[..., :n][:, :, None]
        return logits.masked_fill_(~mask, float("-inf")).softmax(dim=-1).view(b, hq, q, n)

    def visible_prefix(self, max_query_position: int) -> int:
        """How many leading cached tokens a query at ``max_query_position`` (or before) may see: the cache
        keeps tokens in position order, so every visible one lies in this prefix."""
        if self.num_evictions == 0:
            return min(self.positions.shape[-1], max_query_position + 1)
        return int((self.positions <= max_query_position).sum(-1).max())

    def kv_bytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def _map_batch(self, fn) -> None:
        if not self.is_initialized:
            return
        b = self.keys.shape[0]
        self.keys, self.values = fn(self.keys), fn(self.values)
        self.positions, self.valid = fn(self.positions), fn(self.valid)
        for st in self.states.values():
            for name, value in list(st.items()):
                if isinstance(value, torch.Tensor) and value.dim() > 1 and value.shape[0] == b:
                    st[name] = fn(value)
            for name, value in st.get("token", {}).items():
                st["token"][name] = fn(value)


def _gather_tokens(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``t[b, h, keep[b, h, i], :]`` as one row copy (much faster than ``gather`` over the last dim)."""
    b, h, n, d = t.shape
    base = torch.arange(b * h, device=keep.device).view(b, h, 1) * n
    rows = (keep + base).reshape(-1)
    return t.reshape(b * h * n, d).index_select(0, rows).view(b, h, keep.shape[-1], d)
