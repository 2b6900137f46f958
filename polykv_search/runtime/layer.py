"""`EvictingLayer`: one layer's physical KV cache with per-token positions and its eviction plan.

What a layer applies in each phase is a :class:`PhasePlan`; :func:`eviction_target` is the one statement of
when and how far it evicts (the runtime's layers, the row-batched layer and the tests' oracle all call it).

Each cached token carries its absolute sequence index (``positions``) and whether it is a real token
(``valid``: left padding is not), per batch row and KV head, so every layer can hold a different
number of tokens and the runtime still builds an exact per-layer mask. RoPE phases of kept keys are
the ones computed when the token was seen; nothing is re-rotated.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from polykv_search.patterns import make_pattern
from polykv_search.patterns.base import PassInputs, Pattern
from polykv_search.patterns.selection import keep_per_head
from polykv_search.patterns.state import PatternState
from polykv_search.runtime.base_layer import DECODING, INTERVAL_MODES, PREFILL, RuntimeLayer  # noqa: F401
from polykv_search.runtime.report import LayerReport, report_of
from polykv_search.runtime.storage import TokenStore, capacity_for


@dataclass(frozen=True)
class PhasePlan:
    """The pattern and budget a layer applies in one phase (``budget=None``: keep all)."""

    pattern: Pattern
    budget: int | None

    @property
    def evicts(self) -> bool:
        return self.budget is not None and not self.pattern.keeps_all


#: The no-eviction plan.
FULL_PLAN = PhasePlan(make_pattern("full"), None)


def eviction_target(
    phase: str, length: int, budget: int | None, *, interval: int, mode: str, steps_since_eviction: int
) -> int | None:
    """How many tokens a layer keeps after an attention call, or None when it does not evict.

    ``length``: tokens held now; ``budget``: the phase's budget (None: keep all);
    ``steps_since_eviction``: decoding steps since the layer last evicted, this one included.
    Prefill compresses to the budget. Decoding, once over the budget: mode ``"within"`` evicts at once,
    down to ``budget - k + 1`` (``k = interval``; at least 1) so the next ``k - 1`` steps fit;
    mode ``"over"`` evicts down to the budget once ``k`` steps have passed.
    """
    if budget is None or length <= budget:
        return None
    if phase == PREFILL:
        return budget
    if mode == "within":
        return budget - min(interval, budget) + 1
    return budget if steps_since_eviction >= interval else None


class EvictingLayer(RuntimeLayer):
    """A dynamic cache layer that shrinks itself to its budget after the attention kernel.

    Every attention call goes through :meth:`attention_call`: :meth:`begin_call` (marks padding, sets
    query positions), the observing patterns' ``pre_kernel``, the kernel, their ``post_kernel``, then
    :meth:`end_call` (evicts as :func:`eviction_target` says).

    ``defer_prefill``: keep the whole prompt after the prefill call until a reconstruction pass has
    run (:mod:`polykv_search.runtime.reconstruction`; set when any layer's strategy uses a model-level
    pattern): :meth:`begin_pass` / :meth:`end_pass` bracket the pass, :meth:`finish_deferred` evicts.
    """

    def __init__(
        self, layer_idx: int, prefill: PhasePlan, decoding: PhasePlan, *, defer_prefill: bool = False, **kwargs
    ):
        self.plans = {PREFILL: prefill, DECODING: decoding}
        self.defer_prefill = defer_prefill
        super().__init__(layer_idx, **kwargs)
        if self.ragged and self.decode_interval != 1:
            raise ValueError(
                f"layer {layer_idx}: a pooled allocation (kvzip's allocation='layer' or 'model') evicts every "
                f"decoding step; decode_interval must be 1, got {self.decode_interval}"
            )

    @property
    def ragged(self) -> bool:
        """True when a plan uses a pooled pattern, whose KV heads hold different numbers of tokens
        (:mod:`polykv_search.runtime.pooled`)."""
        return any(plan.evicts and plan.pattern.pooled is not None for plan in self.plans.values())

    def reset(self) -> None:
        super().reset()
        self.states: dict[Pattern, PatternState] = {}
        #: True from a deferred prefill call until :meth:`finish_deferred`.
        self.deferred = False
        self.pass_prompt = None
        #: Per phase, this layer's part of a pooled allocation (:func:`polykv_search.runtime.pooled.allocate`).
        self.shares: dict = {}

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
        n, counts, store = self.length, self.counts, self._store
        if store is None or store.capacity < n + q:
            capacity = capacity_for(n + q, self._slack())
            if counts is None or store is None:
                store = TokenStore.holding(self._keys, self._values, self._positions, self._valid, capacity)
            else:  # a store of rows keeps its padding finite (it is attended over, masked)
                store = store.grown(n, capacity)
        # a store of rows appends at each row's own slot (every row as long: one slice)
        store.append(n if counts is None or min(counts) == n else counts, key_states, value_states, self.seen)
        if counts is None:
            self._expose(store, n + q)
        else:
            self.hold_rows(store, [c + q for c in counts])
        self.seen += q
        self._notify_update(kwargs.get("kwargs"))
        return self._keys, self._values

    def restore(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor,
        valid: torch.Tensor,
        *,
        seen: int,
        calls: int,
        num_evictions: int,
        steps_since_eviction: int,
        peak_length: int,
        states: dict[Pattern, PatternState],
    ) -> None:
        """Hold exactly these tokens, counters and pattern states (a row handed back by a batch)."""
        self.keys, self.values, self.positions, self.valid = keys, values, positions, valid
        self.seen, self.calls = seen, calls
        self.num_evictions, self.steps_since_eviction = num_evictions, steps_since_eviction
        self.peak_length = peak_length
        self.states = states

    def cells(self) -> list[tuple[EvictingLayer, tuple[int, ...] | None]]:
        return [(self, None)]

    def as_row(self) -> EvictingLayer | None:
        return None if self.ragged else self

    def layer_report(self) -> LayerReport:
        return report_of(self, self.plans)

    def forked(self, prefill: PhasePlan, decoding: PhasePlan) -> EvictingLayer:
        """A detached copy of this layer with other plans: the cached tensors shared (never its store, so
        an append lands in a store of the copy's own; an eviction gathers into a new one), the counters
        copied, the pattern states deep-copied (the signal replay's cells fork one primed layer)."""
        new = copy.copy(self)
        new.plans = {PREFILL: prefill, DECODING: decoding}
        new._on_update = None
        new._store = None
        new.states = copy.deepcopy(self.states)
        new.shares = {}
        new.watchers = list(self.watchers)
        new.peak_length = 0
        return new

    def thaw(self) -> None:
        self._thaw_tensors()
        for state in self.states.values():
            state.thaw()

    def _map_batch(self, fn) -> None:
        if not self.is_initialized:
            return
        self.keys, self.values = fn(self.keys), fn(self.values)
        self.positions, self.valid = fn(self.positions), fn(self.valid)
        self.peak_length = self.length
        for state in self.states.values():
            state.map_rows(fn)
        for share in self.shares.values():
            share.map_rows(fn)

    # ------------------------------------------------------------ runtime side
    @property
    def phase(self) -> str:
        """The phase of the call in progress: the first call of a layer is its prefill."""
        return PREFILL if self.calls == 0 else DECODING

    def observers(self) -> list[tuple[Pattern, PatternState]]:
        """Patterns that watch this call: the prefill pattern during prefill, and always the decoding
        pattern (so that, e.g., H2O decoding has the prompt's accumulated attention). Identical
        patterns share one state. During a reconstruction pass: none (:meth:`observe_pass` instead)."""
        if self.pass_prompt is not None:
            return []
        decoding = self.plans[DECODING]
        if self.calls:  # the common case, without building the dict
            if not decoding.evicts:
                return []
            return [(decoding.pattern, self._state(decoding.pattern))]
        seen: dict[Pattern, PatternState] = {}
        for plan in (self.plans[PREFILL], decoding):
            if plan.evicts and plan.pattern not in seen:
                seen[plan.pattern] = self._state(plan.pattern)
        return list(seen.items())

    def _state(self, pattern: Pattern) -> PatternState:
        state = self.states.get(pattern)
        if state is None:
            state = self.states[pattern] = PatternState()
        return state

    def model_level_states(self) -> list[tuple[Pattern, PatternState]]:
        """The model-level patterns of both plans (one state each) that the reconstruction pass feeds."""
        seen: dict[Pattern, PatternState] = {}
        for plan in self.plans.values():
            if plan.evicts and plan.pattern.model_level:
                seen.setdefault(plan.pattern, self._state(plan.pattern))
        return list(seen.items())

    def observe_pass(self, query: torch.Tensor, lse: torch.Tensor | None, inputs: PassInputs | None = None) -> None:
        prompt = self.pass_prompt
        assert prompt is not None
        for pattern, state in self.model_level_states():
            pattern.reconstruct(self, state, query, prompt, lse, inputs)

    def begin_call(self, q_len: int, padding_mask: torch.Tensor | None) -> None:
        """Mark this call's padding tokens invalid and record the query positions."""
        if self.deferred and self.pass_prompt is None:
            raise RuntimeError(
                f"polykv-search: layer {self.layer_idx} still waits for its reconstruction pass (a model-level "
                "pattern such as kvzip); run the prompt through the applied runtime, which runs the pass"
            )
        self.query_range = range(self.seen - q_len, self.seen)
        if padding_mask is not None:
            new_valid = padding_mask[:, self.seen - q_len : self.seen].to(torch.bool)
            if not bool(new_valid.all()):
                self._valid[..., -q_len:] = new_valid[:, None, :]
                self._all_valid = False

    def end_call(self) -> None:
        """Evict as :func:`eviction_target` says for this call's phase."""
        if self.pass_prompt is not None:  # a reconstruction call: back to the prompt, nothing counted
            self.cut_to(self.pass_prompt)
            return
        phase = self.phase
        self.calls += 1
        if phase == PREFILL and self.defer_prefill:
            self.deferred = True
            return
        self._evict_for(phase)

    def finish_deferred(self) -> None:
        """Run the prefill eviction a deferred prefill call skipped (after the reconstruction pass)."""
        if self.deferred:
            self.deferred = False
            self._evict_for(PREFILL)

    def begin_pass(self, prompt_len: int) -> None:
        """Enter reconstruction mode: calls append, observe through ``reconstruct`` and cut back."""
        if self.length != prompt_len or self.seen != prompt_len:
            raise RuntimeError(f"layer {self.layer_idx}: a reconstruction pass needs the whole prompt cached")
        self.pass_prompt = prompt_len

    def end_pass(self) -> None:
        self.pass_prompt = None

    def cut_to(self, n: int) -> None:
        """Hold only the first ``n`` slots again and count ``n`` tokens seen (undo a pass call)."""
        store = self._store
        if store is None:
            self.keys, self.values = self._keys[:, :, :n], self._values[:, :, :n]
            self.positions, self.valid = self._positions[:, :, :n], self._valid[:, :, :n]
        else:
            self._expose(store, n)
        self._all_valid = None
        self.seen = n
        self.query_range = range(0)

    def _evict_for(self, phase: str) -> None:
        plan = self.plans[phase]
        if phase == DECODING:
            self.steps_since_eviction += 1
        if plan.evicts and plan.pattern.pooled is not None:
            self._evict_pooled(phase, plan)
        elif plan.evicts:
            target = eviction_target(
                phase,
                self.length,
                plan.budget,
                interval=self.decode_interval,
                mode=self.interval_mode,
                steps_since_eviction=self.steps_since_eviction,
            )
            if target is not None:
                self.evict(plan, target)
        if phase == PREFILL:
            decoding = self.plans[DECODING].pattern
            self.states = {k: v for k, v in self.states.items() if k == decoding}
        self.peak_length = max(self.peak_length, self.length)

    def evict(self, plan: PhasePlan, budget: int | None = None) -> None:
        """Keep ``budget`` (default: the plan's) tokens chosen by the plan's pattern."""
        budget = plan.budget if budget is None else budget
        assert budget is not None, "an evicting plan has a budget"
        with torch.no_grad():  # the choice is not differentiable (the gather below stays so)
            keep = plan.pattern.cache_update(self, self._state(plan.pattern), budget)  # [B, Hkv, b]
        store = self._store
        if store is None:  # tensors assigned from outside: gather from them once
            store = TokenStore.holding(self._keys, self._values, self._positions, self._valid, self.length)
        self._expose(store.gathered(keep, budget + self._slack()), budget)
        if self._all_valid is False:
            self._all_valid = None
        for state in self.states.values():
            state.gather(keep)
        self.num_evictions += 1
        self.steps_since_eviction = 0

    def _evict_pooled(self, phase: str, plan: PhasePlan) -> None:
        """Evict to this layer's counts in its pool (:mod:`polykv_search.runtime.pooled`)."""
        share = self.shares.get(phase)
        if share is None:
            raise RuntimeError(
                f"layer {self.layer_idx}: {plan.pattern.name} with allocation {plan.pattern.pooled!r} evicts "
                "after the runtime's reconstruction pass has allocated its pool; apply it through "
                "polykv_search.runtime.apply_strategy"
            )
        counts = share.counts(self.seen)
        if bool((self._valid.sum(-1) > counts).any()):
            self.evict_per_head(plan, counts)

    def evict_per_head(self, plan: PhasePlan, counts: torch.Tensor) -> None:
        """Keep ``counts[b, h]`` tokens ``[B, Hkv]`` in each row and KV head, chosen by the plan's pattern;
        the store is as long as the largest count, the other heads' extra slots padding."""
        with torch.no_grad():
            assert plan.budget is not None, "an evicting plan has a budget"
            key = plan.pattern.selection_key(self, self._state(plan.pattern), [plan.budget])
            keep, kept = keep_per_head(key, counts)
        store = self._store
        if store is None:
            store = TokenStore.holding(self._keys, self._values, self._positions, self._valid, self.length)
        m = keep.shape[-1]
        new = store.gathered(keep, m + self._slack())
        ragged = m and not bool(kept.all())
        if ragged:
            new.valid[:, :, :m] &= kept
            new.positions[:, :, :m].masked_fill_(~kept, -1)
        self._expose(new, m)
        if ragged:
            self._all_valid = False
        elif self._all_valid is False:  # the padding may be gone
            self._all_valid = None
        for state in self.states.values():
            state.gather(keep)
        self.num_evictions += 1
        self.steps_since_eviction = 0
