"""The fan-out layout: the scorer's shared context call, a FullKV kernel group whose cells ride on its store.

One FullKV prompt store runs the kernel, and every entry's row (a detached layer holding that entry's plans)
is fed the same keys and values and compressed by its own prefill plan. The rows run no kernel of their own:
they are :class:`SharedCells` of the store's kernel group, which the one call protocol
(:meth:`~polykv_search.runtime.base_layer.RuntimeLayer.attention_call`) begins, lets observe and ends with the
store's call. Every row holds the same prompt, so each distinct (pattern, query heads) observes once and the
other rows of it get a copy of its state; every row's kept set is exactly what the row would keep alone.

In a reconstruction pass the store's kernel sees the FullKV prompt and the pass tokens whatever the rows hold,
and hands its log-sum-exp to the deferred rows' model-level patterns: each distinct pattern reconstructs once
over the store, and every row of it gets a copy (a head group's row the KV heads it holds).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polykv_search.patterns.base import PassInputs
from polykv_search.patterns.state import PatternState
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layer import FULL_PLAN, EvictingLayer
from polykv_search.runtime.layouts import GroupedLayer, KernelGroup, query_heads
from polykv_search.runtime.view import small_ops


class SharedCells:
    """The rows of a kernel group that share its store's prompt (see the module docstring): fed its keys and
    values, begun, observed and ended with its calls, each row's cells evicting by their own plans."""

    def __init__(self, rows: Sequence[RuntimeLayer], groups: int):
        self.rows = list(rows)
        #: every row's cells (a row split into head groups: one per group) with their query heads
        self.members = [
            (cell, None if kv is None else tuple(query_heads(kv, groups)))
            for row in self.rows
            for cell, kv in row.cells()
        ]
        self.pattern_groups: dict = {}
        #: during a reconstruction pass: one state per model-level pattern, for every KV head
        self._pass_states: dict = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        with small_ops():
            for row in self.rows:
                row.update(key_states, value_states)

    def cells(self) -> list[tuple[EvictingLayer, tuple[int, ...] | None]]:
        return [cell for row in self.rows for cell in row.cells()]

    def entries(self) -> list[list[EvictingLayer]]:
        """One entry per row (each row's pool is its own)."""
        return [entry for row in self.rows for entry in row.entries()]

    def thaw(self) -> None:
        for row in self.rows:
            row.thaw()

    def write_back(self) -> None:
        """Nothing: the rows hold their own tokens."""

    def begin_call(self, q_len: int, padding_mask: torch.Tensor | None, passing: bool) -> None:
        """Begin every row's call and group its observers by (pattern, query heads); in a reconstruction pass
        (``passing``) group the deferred rows' model-level patterns by (pattern, KV heads) instead."""
        self.pattern_groups = {}
        if passing:
            for cell, kv_heads in self.cells():
                if cell.deferred:
                    for pattern, state in cell.model_level_states():
                        self.pattern_groups.setdefault((pattern, kv_heads), []).append((cell, state))
            return
        for cell, heads in self.members:
            cell.begin_call(q_len, padding_mask)
            for pattern, state in cell.observers():
                self.pattern_groups.setdefault((pattern, heads), []).append((cell, state))

    def observers(self, passing: bool) -> list:
        return [(self, None)] if self.pattern_groups and not passing else []

    def pre_kernel(self, layer, state, query) -> None:
        for (pattern, heads), members in self.pattern_groups.items():
            row, st = members[0]
            pattern.pre_kernel(row, st, _heads_of(query, heads))

    def post_kernel(self, layer, state, query) -> None:
        for (pattern, heads), members in self.pattern_groups.items():
            row, st = members[0]
            pattern.post_kernel(row, st, _heads_of(query, heads))
            for _, other in members[1:]:
                other.replace_with(st)

    def observe_pass(self, store, query: torch.Tensor, lse: torch.Tensor | None, inputs: PassInputs | None) -> None:
        """Each distinct model-level pattern reconstructs once over ``store`` (the prompt and the pass tokens)
        with the store kernel's log-sum-exp ``lse``; every deferred row of it gets a copy."""
        prompt = store.pass_prompt
        done = set()
        for (pattern, kv_heads), members in self.pattern_groups.items():
            st = self._pass_states.setdefault(pattern, PatternState())
            if pattern not in done:
                pattern.reconstruct(store, st, query, prompt, lse, inputs)
                done.add(pattern)
            part = st if kv_heads is None else st.heads(list(kv_heads))
            for _, other in members:
                other.replace_with(part)

    def end_call(self, passing: bool) -> None:
        if not passing:
            with small_ops():
                for cell, _ in self.members:  # a row of head groups counts its groups' calls
                    cell.end_call()
        self.pattern_groups = {}

    def end_pass(self) -> None:
        self._pass_states = {}


def _heads_of(query: torch.Tensor, heads: tuple[int, ...] | None) -> torch.Tensor:
    """The query heads ``heads`` (None: all) of ``query`` ``[B, Hq, q, D]``."""
    if heads is None:
        return query
    return query.index_select(1, torch.tensor(heads, device=query.device))


def fanout_layer(layer_idx: int, rows: Sequence[RuntimeLayer], **kwargs) -> GroupedLayer:
    """The shared prefill of several entries: one kernel group, a FullKV store for the kernel, whose cells are
    ``rows`` (detached single-sequence layers, ``on_update=None``, holding each entry's plans)."""
    store = EvictingLayer(layer_idx, FULL_PLAN, FULL_PLAN, **{**kwargs, "on_update": None})
    return GroupedLayer(layer_idx, [KernelGroup(store, riders=SharedCells(rows, kwargs["groups"]))], **kwargs)
