"""`RowBatchLayer`: single-sequence cache layers decoded as one batch, evicting row groups at once.

The scorer decodes many entries together, and the signal replay continues its cells together. Each row
keeps its own tokens, decoding pattern and budget, but rows live in one padded store (row ``r``'s
``counts[r]`` tokens in slots ``0..counts[r]-1``, the rest invalid), and the rows that share a decoding
pattern form a *group* whose hooks, scores and evictions run as one batched call with per-row budgets.
Patterns whose batched scores are not the per-row scores (``Pattern.batch_exact = False``, e.g. seeded
random draws) get a group per row.

Every row keeps exactly the tokens it would keep alone (:class:`~polykv_search.runtime.EvictingLayer`
with the same plans): scores of valid tokens do not depend on the padding, padding is never kept,
and protection and selection follow each row's own (interval) budget. :meth:`RowBatchLayer.write_back`
hands the rows their state again (when rows leave the batch, and at the end). :class:`GroupView` is what a
row group's pattern sees of the store: that group's rows through the ``LayerView`` protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polykv_search.patterns.base import NEG_INF, Pattern
from polykv_search.patterns.selection import keep_per_row
from polykv_search.patterns.state import PatternState
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layer import DECODING, EvictingLayer, eviction_target
from polykv_search.runtime.storage import TokenStore, capacity_for
from polykv_search.runtime.view import RowsMask, ViewOps


@dataclass
class _Group:
    pattern: Pattern
    rows: list[int]
    budgets: list[int]
    state: PatternState
    index: torch.Tensor | slice
    view: GroupView

    @property
    def default_rows(self) -> bool:
        """True when the pattern ranks rows with the default batched variant (``selection_key``)."""
        return type(self.pattern).cache_update_rows is Pattern.cache_update_rows


class RowBatchLayer(RowsMask, RuntimeLayer):
    """Rows (detached single-sequence layers in their decoding phase) shown as one right-padded batch.

    The attention kernel sees ``keys``/``values`` ``[R, Hkv, N, D]`` with ``N`` the longest row and
    the padding invalid (position -1). The rows' layers are not touched until :meth:`write_back`.
    """

    def __init__(self, layer_idx: int, rows: Sequence[EvictingLayer], **kwargs):
        super().__init__(layer_idx, **kwargs)
        rows = list(rows)
        if not rows:
            raise ValueError("RowBatchLayer needs at least one row")
        first = rows[0]
        if any(row.seen != first.seen or row.calls != first.calls for row in rows) or first.calls < 1:
            raise ValueError("RowBatchLayer rows must have seen the same prompt and be past their prefill")
        self.rows = rows
        self.device = first.keys.device
        self.is_initialized = True
        self.seen, self.calls = first.seen, first.calls
        self.counts = [row.length for row in rows]
        self.row_evictions = [row.num_evictions for row in rows]
        self.row_steps = [row.steps_since_eviction for row in rows]
        self.row_peaks = [row.peak_length for row in rows]
        n = max(self.counts)
        store = TokenStore.padded(len(rows), capacity_for(n, self._slack()), first.keys, first.values)
        for r, row in enumerate(rows):
            store.write(r, 0, row.keys[0], row.values[0], row.positions[0], row.valid[0])
        self._batch = store
        self.row_groups = self._make_groups(rows)
        self._dispatch = _GroupDispatch(self)
        self._refresh()

    # ------------------------------------------------------------------ set-up
    def _make_groups(self, rows: list[EvictingLayer]) -> list[_Group]:
        members: dict[Any, list[int]] = {}
        for r, row in enumerate(rows):
            key = decoding_group(row, r)
            if key is not None:
                members.setdefault(key, []).append(r)
        groups = []
        for key, idx in members.items():
            pattern = key if isinstance(key, Pattern) else key[0]
            contiguous = idx == list(range(idx[0], idx[-1] + 1))
            index = slice(idx[0], idx[-1] + 1) if contiguous else torch.tensor(idx, device=self.device)
            states = [rows[r].states.get(pattern) or PatternState() for r in idx]
            state = PatternState.stack(states, [self.counts[r] for r in idx])
            view = GroupView(
                self.layer_idx,
                num_kv_heads=self.num_kv_heads,
                groups=self.groups,
                scaling=self.scaling,
                sliding_window=self.sliding_window,
                device=self.device,
                rotary=self.rotary,
            )
            budgets = [_budget(rows[r].plans[DECODING]) for r in idx]
            groups.append(_Group(pattern, idx, budgets, state, index, view))
        return groups

    # ------------------------------------------------------- cache layer API
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        store = self._batch
        n_max = max(self.counts)
        if n_max + q > store.capacity:
            store = self._batch = store.grown(n_max, capacity_for(n_max + q, self._slack()))
        # every row the same length: one slice; else each row's own slots
        store.append(n_max if min(self.counts) == n_max else self.counts, key_states, value_states, self.seen)
        self.counts = [c + q for c in self.counts]
        self.seen += q
        self._refresh()
        self._notify_update(kwargs.get("kwargs"))
        return self._keys, self._values

    def begin_call(self, q_len: int, padding_mask) -> None:
        if padding_mask is not None:
            raise ValueError("RowBatchLayer does not support padding")
        self.query_range = range(self.seen - q_len, self.seen)
        for group in self.row_groups:
            self._point_view(group)

    def observers(self):
        return [(self._dispatch, None)] if self.row_groups else []

    def end_call(self) -> None:
        self.calls += 1
        k = self.decode_interval
        self.row_steps = [s + 1 for s in self.row_steps]
        picks = []
        for group in self.row_groups:
            targets = {}
            for j, r in enumerate(group.rows):
                target = eviction_target(
                    DECODING,
                    self.counts[r],
                    group.budgets[j],
                    interval=k,
                    mode=self.interval_mode,
                    steps_since_eviction=self.row_steps[r],
                )
                if target is not None:
                    targets[j] = target
            if targets:
                picks.append((group, targets))
        if picks:
            self._evict(picks)
        self.row_peaks = [max(p, c) for p, c in zip(self.row_peaks, self.counts)]
        self._refresh()

    # ------------------------------------------------------------ eviction
    def _evict(self, picks: list[tuple[_Group, dict[int, int]]]) -> None:
        """Keep ``targets[j]`` tokens of each group's ``j``-th row (for the rows in ``targets``), chosen by
        the group pattern's ``cache_update_rows``; then one compaction serves every group.

        Groups whose pattern uses the default batched variant (rank by ``selection_key``, then
        :func:`~polykv_search.patterns.selection.keep_per_row`) share one ``keep_per_row`` call: its
        rows are independent, so each row gets what its own group's call would give it."""
        end = max(self.counts[g.rows[j]] for g, targets in picks for j in targets)  # the picked rows' slots
        parts: list[tuple[_Group, list[int], list[int], tuple[torch.Tensor, torch.Tensor] | None]] = []
        shared_keys: list[torch.Tensor] = []
        shared_budgets: list[int] = []
        shared_counts: list[int] = []
        for group, targets in picks:
            picked = sorted(targets)
            budgets = [targets[j] for j in picked]
            counts = [self.counts[group.rows[j]] for j in picked]
            if group.default_rows:
                rows = None if len(picked) == len(group.rows) else picked  # None: the whole group, no gather
                key = group.pattern.selection_key(group.view, group.state, budgets, rows)
                shared_keys.append(_pad_to(key, end, NEG_INF))
                shared_budgets += budgets
                shared_counts += counts
                parts.append((group, picked, budgets, None))
            else:
                chosen = group.pattern.cache_update_rows(group.view, group.state, picked, budgets, counts)
                parts.append((group, picked, budgets, chosen))
        if shared_keys:
            key = shared_keys[0] if len(shared_keys) == 1 else torch.cat(shared_keys)
            shared = keep_per_row(key, shared_budgets, shared_counts)
        width = max(max(budgets) for _, _, budgets, _ in parts)
        keeps, kepts, rows, all_budgets, at = [], [], [], [], 0
        for group, picked, budgets, own in parts:
            if own is None:
                own = (shared[0][at : at + len(picked)], shared[1][at : at + len(picked)])
                at += len(picked)
            keeps.append(_pad_to(own[0], width))
            kepts.append(_pad_to(own[1], width))
            rows += [group.rows[j] for j in picked]
            all_budgets += budgets
        keep = keeps[0] if len(keeps) == 1 else torch.cat(keeps)  # [E, H, m], bool [E, 1, m]
        kept = kepts[0] if len(kepts) == 1 else torch.cat(kepts)
        keep, kept = _pad_to(keep, end), _pad_to(kept, end)
        self._batch.compact(torch.tensor(rows, device=self.device), keep, kept)
        at = 0
        for group, picked, _, _ in parts:
            part = slice(at, at + len(picked))
            at += len(picked)
            whole = len(picked) == len(group.rows)
            group.state.gather_rows(None if whole else picked, keep[part], kept[part], end)
        for r, b in zip(rows, all_budgets):
            self.counts[r] = b
            self.row_evictions[r] += 1
            self.row_steps[r] = 0

    # ------------------------------------------------------------- views
    def _refresh(self) -> None:
        n = max(self.counts)
        self._keys, self._values, self._positions, self._valid = self._batch.views(n)
        self._all_valid = min(self.counts) == n
        self.num_evictions = max(self.row_evictions)

    def _point_view(self, group: _Group) -> None:
        """Point the group's view at its rows' slots: the rows' longest prefix of the store."""
        store = self._batch
        counts = [self.counts[r] for r in group.rows]
        n = max(counts)
        if isinstance(group.index, slice):
            take = lambda t: t[group.index, :, :n]  # noqa: E731
        else:
            take = lambda t: t[:, :, :n].index_select(0, group.index)  # noqa: E731
        group.view.show(
            take(store.keys),
            lambda: take(store.values),
            take(store.positions),
            take(store.valid),
            counts=counts,
            all_valid=all(c == n for c in counts),
            seen=self.seen,
            calls=self.calls,
            num_evictions=max(self.row_evictions[r] for r in group.rows),
            query_range=self.query_range,
        )
        group.state.fit(n)

    def write_back(self) -> None:
        """Give every row its tokens, counters and pattern state again (compact, unpadded)."""
        states = {r: row.states for r, row in enumerate(self.rows)}
        for group in self.row_groups:
            for j, r in enumerate(group.rows):
                states[r] = {group.pattern: group.state.take_row(j, self.counts[r])}
        store = self._batch
        for r, row in enumerate(self.rows):
            c = self.counts[r]
            row.restore(
                store.keys[r : r + 1, :, :c],
                store.values[r : r + 1, :, :c],
                store.positions[r : r + 1, :, :c],
                store.valid[r : r + 1, :, :c],
                seen=self.seen,
                calls=self.calls,
                num_evictions=self.row_evictions[r],
                steps_since_eviction=self.row_steps[r],
                peak_length=self.row_peaks[r],
                states=states[r],
            )


def _budget(plan) -> int:
    if plan.budget is None:
        raise ValueError("a row group's rows evict in decoding: their plans have budgets")
    return plan.budget


def decoding_group(row: EvictingLayer, r: int) -> Any:
    """The key of the group row ``r`` joins in a :class:`RowBatchLayer` (rows with equal keys are scored
    and evict as one call), or None for a row that never evicts in decoding."""
    plan = row.plans[DECODING]
    if not plan.evicts:
        return None
    return plan.pattern if plan.pattern.batch_exact else (plan.pattern, r)


class _GroupDispatch:
    """The one observer a :class:`RowBatchLayer` shows the runtime: each group's pattern hooks run
    once, on the group's view with the group's rows of the queries."""

    def __init__(self, batch: RowBatchLayer):
        self.batch = batch

    def _queries(self, group: _Group, query: torch.Tensor) -> torch.Tensor:
        return query[group.index] if isinstance(group.index, slice) else query.index_select(0, group.index)

    def pre_kernel(self, layer, state, query) -> None:
        for group in self.batch.row_groups:
            group.pattern.pre_kernel(group.view, group.state, self._queries(group, query))

    def post_kernel(self, layer, state, query) -> None:
        for group in self.batch.row_groups:
            group.pattern.post_kernel(group.view, group.state, self._queries(group, query))


def _pad_to(t: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """``t`` right-padded along its last axis to ``width`` (``t`` itself when it is that wide)."""
    return t if t.shape[-1] == width else torch.nn.functional.pad(t, (0, width - t.shape[-1]), value=value)


class GroupView(RowsMask, ViewOps):
    """A group's rows of the batch store, as its pattern reads them (no padding queries; ``values`` are
    sliced out only when a pattern reads them). :meth:`show` points it at the rows before each call."""

    all_valid: bool

    def __init__(
        self, layer_idx: int, *, num_kv_heads: int, groups: int, scaling: float, sliding_window, device, rotary=None
    ):
        self.layer_idx = layer_idx
        self.num_kv_heads = num_kv_heads
        self.groups = groups
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.device = device
        self.rotary = rotary
        # nothing until shown: no rows, no slots
        self.keys = torch.empty(0, num_kv_heads, 0, 0, device=device)
        self.positions = torch.empty(0, num_kv_heads, 0, dtype=torch.long, device=device)
        self.valid = torch.empty(0, num_kv_heads, 0, dtype=torch.bool, device=device)
        self._values: torch.Tensor | None = None
        self._take_values: Callable[[], torch.Tensor] | None = None
        self._counts: list[int] = []
        self._counts_tensor: torch.Tensor | None = None
        self.all_valid = True
        self.seen = self.calls = self.num_evictions = 0
        self.query_range = range(0)

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            assert self._take_values is not None, "a GroupView shows values only once it is shown rows"
            self._values = self._take_values()
        return self._values

    @property
    def length(self) -> int:
        return self.keys.shape[-2]

    def row_counts(self) -> torch.Tensor:
        """Tokens each row holds ``[R_g]`` (long): the rows are compact, row ``e``'s in slots
        ``0..count-1`` on every head (:func:`~polykv_search.patterns.selection.protected_ends` reads it)."""
        if self._counts_tensor is None:
            self._counts_tensor = torch.tensor(self._counts, device=self.device)
        return self._counts_tensor

    def real_prefix(self) -> int | None:
        return min(self._counts) if self._counts else super().real_prefix()

    def show(
        self,
        keys: torch.Tensor,
        values: Callable[[], torch.Tensor],
        positions: torch.Tensor,
        valid: torch.Tensor,
        *,
        counts: list[int],
        all_valid: bool,
        seen: int,
        calls: int,
        num_evictions: int,
        query_range: range,
    ) -> None:
        """Show these rows (``[R_g, Hkv, n, ...]`` slices of the store; ``values()`` slices the values) and
        counters."""
        self._values, self._take_values = None, values
        self.keys, self.positions, self.valid, self.all_valid = keys, positions, valid, all_valid
        if counts != self._counts:
            self._counts, self._counts_tensor = counts, None
        self.seen, self.calls, self.num_evictions, self.query_range = seen, calls, num_evictions, query_range

    def query_valid(self, q_len: int) -> torch.Tensor | None:
        return None

    def attention_probs(self, query, query_positions, upto=None):
        probs = super().attention_probs(query, query_positions, upto)
        # A query that sees none of a row's keys (a SnapKV window query older than every kept token)
        # has NaN probabilities; alone, the row's window mask zeroes all of them, but here they would
        # also reach the padding slots (and SnapKV's pooling). Zero is what the row alone ends with.
        return probs if self.all_valid else probs.nan_to_num_(0.0)
