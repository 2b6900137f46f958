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
from polykv_search.runtime.storage import TokenStore, capacity_for
from strategies import PHASES

PREFILL, DECODING = PHASES

#: How ``decode_interval = k`` evicts: ``"within"`` keeps every layer at or below its budget (it evicts
#: down to ``budget - k + 1`` once over it); ``"over"`` lets it hold up to ``budget + k - 1`` tokens.
INTERVAL_MODES = ("within", "over")


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

    Every attention call goes through :meth:`attention_call` (the one place that runs the hooks, in this
    order): :meth:`begin_call` (marks padding, sets query positions), the observing patterns'
    ``pre_kernel``, the kernel, their ``post_kernel``, then :meth:`end_call` (evicts when over budget).
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
        interval_mode: str = "within",
        on_update=None,
    ):
        super().__init__()
        if interval_mode not in INTERVAL_MODES:
            raise ValueError(f"interval_mode must be one of {INTERVAL_MODES}, got {interval_mode!r}")
        self.layer_idx = layer_idx
        self.plans = {PREFILL: prefill, DECODING: decoding}
        self.num_kv_heads = num_kv_heads
        self.groups = groups
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.decode_interval = decode_interval
        self.interval_mode = interval_mode
        self._on_update = on_update
        self.reset()

    # ------------------------------------------------- the cached tensors
    # ``keys``/``values`` ``[B, Hkv, n, D]``, ``positions`` (int64 sequence index) and ``valid`` (bool)
    # ``[B, Hkv, n]``: views of the layer's own :class:`TokenStore`, or tensors assigned from outside
    # (then the next append moves them into a store of this layer's own).
    keys = property(lambda self: self._keys, lambda self, t: self._assign("_keys", t))
    values = property(lambda self: self._values, lambda self, t: self._assign("_values", t))
    positions = property(lambda self: self._positions, lambda self, t: self._assign("_positions", t))
    valid = property(lambda self: self._valid, lambda self, t: self._assign("_valid", t))

    def _assign(self, name: str, tensor: torch.Tensor | None) -> None:
        setattr(self, name, tensor)
        self._store = None
        if name == "_valid":
            self._all_valid = None

    def _expose(self, store: TokenStore, n: int) -> None:
        self._keys, self._values, self._positions, self._valid = store.views(n)
        self._store = store

    @property
    def all_valid(self) -> bool:
        """True when every cached token of every row and head is a real token (no padding)."""
        if self._all_valid is None:
            self._all_valid = self._valid is None or bool(self._valid.all())
        return self._all_valid

    def _slack(self) -> int:
        """Free slots a store keeps past its tokens: a decoding interval's worth, plus some."""
        return self.decode_interval + 16

    # ------------------------------------------------------- CacheLayerMixin API
    def reset(self) -> None:
        self._keys = self._values = self._positions = self._valid = None
        self._store: TokenStore | None = None
        self._all_valid: bool | None = True
        self.is_initialized = False
        self.seen = 0
        self.calls = 0
        self.num_evictions = 0
        self.steps_since_eviction = 0
        self.peak_length = 0
        self.query_range = range(0)
        self.states: dict[Pattern, dict[str, Any]] = {}

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, _ = key_states.shape
        self.device = key_states.device
        self.keys = key_states[:, :, :0]
        self.values = value_states[:, :, :0]
        self.positions = torch.zeros(b, h, 0, dtype=torch.long, device=self.device)
        self.valid = torch.zeros(b, h, 0, dtype=torch.bool, device=self.device)
        self._all_valid = True
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        n = self.length
        store = self._store
        if store is None or store.capacity < n + q:
            capacity = capacity_for(n + q, self._slack())
            store = TokenStore.holding(self._keys, self._values, self._positions, self._valid, capacity)
        store.keys[:, :, n : n + q] = key_states
        store.values[:, :, n : n + q] = value_states
        if q == 1:
            store.positions[:, :, n].fill_(self.seen)
        else:
            store.positions[:, :, n : n + q] = torch.arange(self.seen, self.seen + q, device=self.device)
        store.valid[:, :, n : n + q] = True
        self._expose(store, n + q)
        self.seen += q
        if self._on_update is not None:
            self._on_update(self)
        return self._keys, self._values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "an evicting cache cannot be cropped (assisted/speculative decoding is not supported)"
        )

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
        return 0 if self._keys is None else self._keys.shape[-2]

    @property
    def query_positions(self) -> torch.Tensor:
        """Sequence positions ``[q]`` of the call in progress (``query_range`` as a tensor)."""
        return torch.arange(self.query_range.start, self.query_range.stop, device=self.device)

    @property
    def phase(self) -> str:
        """The phase of the call in progress: the first call of a layer is its prefill."""
        return PREFILL if self.calls == 0 else DECODING

    def observers(self) -> list[tuple[Pattern, dict]]:
        """Patterns that watch this call: the prefill pattern during prefill, and always the decoding
        pattern (so that, e.g., H2O decoding has the prompt's accumulated attention). Identical
        patterns share one state."""
        decoding = self.plans[DECODING]
        if self.calls:  # the common case, without building the dict
            if not decoding.evicts:
                return []
            return [(decoding.pattern, self.states.setdefault(decoding.pattern, {}))]
        plans = [self.plans[PREFILL], decoding]
        seen: dict[Pattern, dict] = {}
        for plan in plans:
            if plan.evicts and plan.pattern not in seen:
                seen[plan.pattern] = self.states.setdefault(plan.pattern, {})
        return list(seen.items())

    def attention_call(
        self, query: torch.Tensor, padding_mask: torch.Tensor | None, kernel=None, *, finish: bool = True
    ):
        """Run one attention call of this layer: hooks around ``kernel()`` (``None``: no kernel, e.g. a
        replay of recorded queries); ``finish=False`` stops before :meth:`end_call`. Returns the
        kernel's output."""
        self.begin_call(query.shape[-2], padding_mask)
        observers = self.observers()
        for pattern, state in observers:
            pattern.pre_kernel(self, state, query)
        out = None if kernel is None else kernel()
        for pattern, state in observers:
            pattern.post_kernel(self, state, query)
        if finish:
            self.end_call()
        return out

    def begin_call(self, q_len: int, padding_mask: torch.Tensor | None) -> None:
        """Mark this call's padding tokens invalid and record the query positions."""
        self.query_range = range(self.seen - q_len, self.seen)
        if padding_mask is not None:
            new_valid = padding_mask[:, self.seen - q_len : self.seen].to(torch.bool)
            if not bool(new_valid.all()):
                self._valid[..., -q_len:] = new_valid[:, None, :]
                self._all_valid = False

    def end_call(self) -> None:
        """Evict down to the phase's budget when over it (decoding: every ``decode_interval`` steps)."""
        phase = self.phase
        self.calls += 1
        plan = self.plans[phase]
        if phase == DECODING:
            self.steps_since_eviction += 1
        if plan.evicts and self.length > plan.budget:
            if phase == PREFILL:
                self.evict(plan)
            elif self.interval_mode == "within":
                # over budget: evict far enough that the next k-1 steps fit (a budget below k evicts sooner)
                self.evict(plan, plan.budget - min(self.decode_interval, plan.budget) + 1)
            elif self.steps_since_eviction >= self.decode_interval:
                self.evict(plan)
        if phase == PREFILL:
            decoding = self.plans[DECODING].pattern
            self.states = {k: v for k, v in self.states.items() if k == decoding}
        self.peak_length = max(self.peak_length, self.length)

    def evict(self, plan: PhasePlan, budget: int | None = None) -> None:
        """Keep ``budget`` (default: the plan's) tokens chosen by the plan's pattern."""
        budget = plan.budget if budget is None else budget
        state = self.states.setdefault(plan.pattern, {})
        keep = plan.pattern.cache_update(self, state, budget)  # [B, Hkv, b]
        store = self._store
        if store is None:  # tensors assigned from outside: gather from them once
            store = TokenStore.holding(self._keys, self._values, self._positions, self._valid, self.length)
        self._expose(store.gathered(keep, budget + self._slack()), budget)
        if self._all_valid is False:
            self._all_valid = None
        for st in self.states.values():
            for name, tensor in st.get("token", {}).items():
                st["token"][name] = tensor.gather(-1, keep)
        self.num_evictions += 1
        self.steps_since_eviction = 0

    # ------------------------------------------------------- helpers for patterns
    def allowed(self, query_positions: torch.Tensor | range) -> torch.Tensor:
        """Bool mask broadcastable to ``[B, Hkv, q, n]``: which cached keys each query may attend to.

        Before any eviction and without padding, every row and head holds positions ``0..n-1``, so the
        mask is one ``[1, 1, q, n]`` causal (and sliding-window) pattern shared by all of them.
        """
        qpos = _as_tensor(query_positions, self.device)
        if self.num_evictions == 0 and self.all_valid:
            kpos = torch.arange(self.positions.shape[-1], device=self.device)[None, :]
            allowed = kpos <= qpos[:, None]
            if self.sliding_window is not None:
                allowed &= (qpos[:, None] - kpos) < self.sliding_window
            return allowed[None, None]
        kpos = self.positions[:, :, None, :]
        qpos = qpos[None, None, :, None]
        allowed = kpos <= qpos
        if self.sliding_window is not None:
            allowed &= (qpos - kpos) < self.sliding_window
        if self.all_valid:
            return allowed
        # A padding query sees only itself, so no row is empty and no NaN can leak into the cache.
        return (self.valid[:, :, None, :] & allowed) | (kpos == qpos)

    def visibility(self, query_positions: torch.Tensor | range) -> torch.Tensor | None:
        """:meth:`allowed`, or None when every query sees every cached key: no padding, no sliding
        window, and the queries (a ``range``) are the newest token, which comes after every kept one."""
        if (
            isinstance(query_positions, range)
            and len(query_positions)
            and query_positions.start >= self.seen - 1
            and self.sliding_window is None
            and self.all_valid
        ):
            return None
        return self.allowed(query_positions)

    def query_valid(self, q_len: int) -> torch.Tensor | None:
        """Which of this call's ``q_len`` tokens are real ``[B, q]`` (the newest slots), or None when all are."""
        if self.all_valid:
            return None
        valid = self._valid[:, 0, self.length - q_len :]
        return None if bool(valid.all()) else valid

    def repeat_heads(self, t: torch.Tensor) -> torch.Tensor:
        """Expand a KV-head tensor ``[B, Hkv, ...]`` to query heads ``[B, Hq, ...]``."""
        return t if self.groups == 1 else t.repeat_interleave(self.groups, dim=1)

    def group_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Reduce a query-head tensor ``[B, Hq, n]`` to KV heads by summing over each GQA group."""
        b, hq = t.shape[:2]
        return t.reshape(b, hq // self.groups, self.groups, *t.shape[2:]).sum(dim=2)

    def group_mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.group_sum(t) / self.groups

    def attention_probs(
        self, query: torch.Tensor, query_positions: torch.Tensor | range, upto: int | None = None
    ) -> torch.Tensor:
        """Softmax attention ``[B, Hq, q, n]`` (fp32) of ``query`` (at ``query_positions``: a tensor or a
        ``range``) over the cached keys.

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
        if isinstance(query_positions, range) and self.sliding_window is None and self.all_valid:
            # Kept positions are distinct, ascending and < seen, so only the last ``seen - 1 - start``
            # slots can hold a key after the first query: mask just those columns.
            first = self.length - (self.seen - 1 - query_positions.start)
            if q and first < n:
                first = max(first, 0)
                kpos = self.positions[:, :, None, first:n]
                qpos = torch.arange(query_positions.start, query_positions.stop, device=self.device)
                logits[..., first:].masked_fill_((kpos > qpos[:, None])[:, :, None], float("-inf"))
        else:
            mask = self.visibility(query_positions)
            if mask is not None:
                logits.masked_fill_(~mask[..., :n][:, :, None], float("-inf"))
        return logits.softmax(dim=-1).view(b, hq, q, n)

    def visible_prefix(self, max_query_position: int) -> int:
        """How many leading cached tokens a query at ``max_query_position`` (or before) may see: the cache
        keeps tokens in position order, so every visible one lies in this prefix."""
        if self.num_evictions == 0:
            return min(self.positions.shape[-1], max_query_position + 1)
        if max_query_position >= self.seen - 1:  # every kept token is at or before the newest one
            return self.length
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
        self.peak_length = self.length
        for st in self.states.values():
            for name, value in list(st.items()):
                if isinstance(value, torch.Tensor) and value.dim() > 1 and value.shape[0] == b:
                    st[name] = fn(value)
            for name, value in st.get("token", {}).items():
                st["token"][name] = fn(value)


def _as_tensor(positions: torch.Tensor | range, device) -> torch.Tensor:
    if isinstance(positions, range):
        return torch.arange(positions.start, positions.stop, device=device)
    return positions.to(device)
