"""`FanoutLayer`: the scorer's shared context call.

One FullKV prompt for the kernel, and one row per entry that receives the same keys/values and is
compressed by its own prefill plan. Every row's kept set is exactly what the row would keep alone: the
rows' hooks and evictions run on the rows themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polykv_search.patterns.base import PassInputs
from polykv_search.patterns.state import PatternState
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.kernels import small_ops
from polykv_search.runtime.layer import FULL_PLAN, EvictingLayer
from polykv_search.runtime.layouts import query_heads


class _SharedDispatch:
    """The one observer a :class:`FanoutLayer` shows the runtime: each distinct pattern's hooks run
    once, on the first row that observes with it; the other rows observing with that pattern get a
    deep copy of its state (every row holds the same prompt, so the statistics are the same). A head
    group of a row is a row of its own KV heads, keyed by pattern and heads, and sees their queries."""

    def __init__(self, fanout: FanoutLayer):
        self.fanout = fanout

    def pre_kernel(self, layer, state, query) -> None:
        for (pattern, heads), members in self.fanout.pattern_groups.items():
            row, st = members[0]
            pattern.pre_kernel(row, st, _heads_of(query, heads))

    def post_kernel(self, layer, state, query) -> None:
        for (pattern, heads), members in self.fanout.pattern_groups.items():
            row, st = members[0]
            pattern.post_kernel(row, st, _heads_of(query, heads))
            for _, other in members[1:]:
                other.replace_with(st)


def _heads_of(query: torch.Tensor, heads: tuple[int, ...] | None) -> torch.Tensor:
    """The query heads ``heads`` (None: all) of ``query`` ``[B, Hq, q, D]``."""
    if heads is None:
        return query
    return query.index_select(1, torch.tensor(heads, device=query.device))


class FanoutLayer(EvictingLayer):
    """The shared prefill of several entries: one FullKV layer for the kernel plus one row per entry.

    ``rows`` are detached single-sequence layers (``on_update=None``) holding each entry's plans. During
    the (prefill) call every row receives this call's keys/values, the rows' observers run once per
    distinct pattern, and ``end_call`` compresses each row with its own prefill plan. The layer itself
    keeps the FullKV prompt (``keys``/``values``).

    Rows with a model-level pattern (``defer_prefill``) keep the prompt until the reconstruction pass;
    the pass runs once on this layer (its kernel sees the FullKV prompt whatever the rows hold) and
    feeds those rows' model-level patterns; the other rows are not touched by it.
    """

    def __init__(self, layer_idx: int, rows: Sequence[RuntimeLayer], **kwargs):
        super().__init__(layer_idx, FULL_PLAN, FULL_PLAN, **kwargs)
        self.rows = list(rows)
        self.pattern_groups: dict = {}
        self._dispatch = _SharedDispatch(self)
        #: during a reconstruction pass: one state per model-level pattern, for every KV head
        self._pass_states: dict = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.pass_prompt is None:
            with small_ops():
                for row in self.rows:
                    row.update(key_states, value_states)
        return super().update(key_states, value_states, *args, **kwargs)

    def begin_call(self, q_len: int, padding_mask) -> None:
        super().begin_call(q_len, padding_mask)
        self.pattern_groups = {}
        if self.pass_prompt is not None:
            for row in self.rows:
                if not row.awaits_pass():
                    continue
                for layer, kv_heads in row.cells():
                    for pattern, state in layer.model_level_states():
                        self.pattern_groups.setdefault((pattern, kv_heads), []).append((layer, state))
            return
        for layer, heads in self._members():
            layer.begin_call(q_len, padding_mask)
            for pattern, state in layer.observers():
                self.pattern_groups.setdefault((pattern, heads), []).append((layer, state))

    def cells(self) -> list[tuple[EvictingLayer, tuple[int, ...] | None]]:
        """The rows' cells (this layer's own FullKV store is none: the pass reaches it directly)."""
        return [cell for row in self.rows for cell in row.cells()]

    def _members(self) -> list[tuple[EvictingLayer, tuple[int, ...] | None]]:
        """Every row's cells (a row split into head groups: one per group) with their query heads."""
        return [(cell, None if kv is None else tuple(query_heads(kv, self.groups))) for cell, kv in self.cells()]

    def observers(self):
        if not self.pattern_groups or self.pass_prompt is not None:
            return []
        return [(self._dispatch, None)]

    def observe_pass(self, query: torch.Tensor, lse: torch.Tensor | None, inputs: PassInputs | None = None) -> None:
        """Each distinct model-level pattern of the deferred rows reconstructs once, over this layer's own
        FullKV prompt and pass tokens, into a state of the pass's own (one per pattern, for every KV head);
        every row of that pattern gets a copy, a head group's row the rows of its KV heads."""
        prompt = self.pass_prompt
        assert prompt is not None
        done = set()
        for (pattern, kv_heads), members in self.pattern_groups.items():
            st = self._pass_states.setdefault(pattern, PatternState())
            if pattern not in done:
                pattern.reconstruct(self, st, query, prompt, lse, inputs)
                done.add(pattern)
            part = st if kv_heads is None else st.heads(list(kv_heads))
            for _, other in members:
                other.replace_with(part)

    def end_call(self) -> None:
        if self.pass_prompt is None:
            with small_ops():
                for layer, _ in self._members():
                    layer.end_call()
                for row in self.rows:
                    if row.cells()[0][0] is not row:  # a row of head groups counts its own calls
                        row.calls += 1
        self.pattern_groups = {}
        super().end_call()

    def thaw(self) -> None:
        super().thaw()
        for row in self.rows:
            row.thaw()

    def end_pass(self) -> None:
        super().end_pass()
        self._pass_states = {}

    def entries(self) -> list[list[EvictingLayer]]:
        return [entry for row in self.rows for entry in row.entries()]

    def finish_deferred(self) -> None:
        for cell, _ in self.cells():
            cell.finish_deferred()
