"""Row batches: single-sequence layers decoded as one padded batch, a layout of the grouped layer.

The scorer decodes many entries together, and the signal replay continues its cells together. Each row keeps its
own tokens, decoding pattern and budget, but the rows live in one padded store (row ``r``'s ``counts[r]`` tokens in
slots ``0..counts[r]-1``, the rest invalid): a kernel group (:func:`~polykv_search.runtime.layouts.row_batch`) whose
store is an :class:`~polykv_search.runtime.EvictingLayer` of full plans over a padded
:class:`~polykv_search.runtime.storage.TokenStore`, and whose cells (:class:`RowCell`) are the rows that share a
decoding pattern: a cell's hooks, scores and evictions run as one batched call with per-row budgets. The cells ride
the store's calls (:class:`RowCells`, as the fan-out's rows do), so the call protocol is the store's. Patterns whose
batched scores are not the per-row scores (``Pattern.batch_exact = False``, e.g. seeded random draws) get a cell
per row.

Every row keeps exactly the tokens it would keep alone (an ``EvictingLayer`` with the same plans): scores of valid
tokens do not depend on the padding, padding is never kept, and protection and selection follow each row's own
(interval) budget. :meth:`RowCells.write_back` hands the rows their tokens, counters and states again (when rows
leave the batch, and at the end).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from polykv_search.patterns.base import NEG_INF, Pattern
from polykv_search.patterns.selection import keep_per_row
from polykv_search.patterns.state import PatternState
from polykv_search.runtime.layer import DECODING, FULL_PLAN, EvictingLayer, eviction_target
from polykv_search.runtime.storage import TokenStore, capacity_for
from polykv_search.runtime.view import ViewOps, rows_mask


class RowCell(ViewOps):
    """One cell of a row batch: the store rows ``rows`` that share a decoding ``pattern``, their ``budgets`` and
    stacked ``state``, and the view of those rows' slots the pattern reads (``LayerView``; no padding queries;
    ``values`` sliced out only when read), pointed at them by :meth:`show` before each call. As an observer of the
    store's call, its hooks run the pattern's on its rows of the queries."""

    all_valid: bool

    def __init__(
        self, store: EvictingLayer, pattern: Pattern, rows: list[int], budgets: list[int | None], state: PatternState
    ):
        self.layer_idx = store.layer_idx
        self.num_kv_heads = store.num_kv_heads
        self.groups = store.groups
        self.scaling = store.scaling
        self.sliding_window = store.sliding_window
        self.device = store.device
        self.rotary = store.rotary
        self.mask = rows_mask
        self.pattern = pattern
        self.rows = rows
        self.budgets = budgets
        self.state = state
        contiguous = rows == list(range(rows[0], rows[-1] + 1))
        self.index = slice(rows[0], rows[-1] + 1) if contiguous else torch.tensor(rows, device=self.device)
        self._take_values: Callable[[], torch.Tensor] | None = None
        self._values: torch.Tensor | None = None
        self._counts: list[int] = []
        self._counts_tensor: torch.Tensor | None = None

    @property
    def default_rows(self) -> bool:
        """True when the pattern ranks rows with the default batched variant (``selection_key``)."""
        return type(self.pattern).cache_update_rows is Pattern.cache_update_rows

    def show(self, store: EvictingLayer, counts: list[int], num_evictions: int) -> None:
        """Show this cell's rows of ``store`` (their longest prefix of its slots; ``counts``: their tokens) and its
        counters."""
        n, index = max(counts), self.index

        def take(t: torch.Tensor) -> torch.Tensor:
            return t[index, :, :n] if isinstance(index, slice) else t[:, :, :n].index_select(0, index)

        self.keys, self.positions, self.valid = take(store.keys), take(store.positions), take(store.valid)
        self._values, self._take_values = None, lambda: take(store.values)
        self.all_valid = all(c == n for c in counts)
        if counts != self._counts:
            self._counts, self._counts_tensor = counts, None
        self.seen, self.calls, self.num_evictions = store.seen, store.calls, num_evictions
        self.query_range = store.query_range
        self.state.fit(n)

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            assert self._take_values is not None, "a row cell shows values only once it is shown its rows"
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

    def query_valid(self, q_len: int) -> torch.Tensor | None:
        return None

    def attention_probs(self, query, query_positions, upto=None):
        probs = super().attention_probs(query, query_positions, upto)
        # A query that sees none of a row's keys (a SnapKV window query older than every kept token)
        # has NaN probabilities; alone, the row's window mask zeroes all of them, but here they would
        # also reach the padding slots (and SnapKV's pooling). Zero is what the row alone ends with.
        return probs if self.all_valid else probs.nan_to_num_(0.0)

    def _queries(self, query: torch.Tensor) -> torch.Tensor:
        index = self.index
        return query[index] if isinstance(index, slice) else query.index_select(0, index)

    def pre_kernel(self, layer, state, query) -> None:
        self.pattern.pre_kernel(self, self.state, self._queries(query))

    def post_kernel(self, layer, state, query) -> None:
        self.pattern.post_kernel(self, self.state, self._queries(query))


class RowCells:
    """The cells of a row batch, riding the calls of its ``store`` (a padded store of the ``rows``' tokens; the rows'
    own layers are not touched until :meth:`write_back`). Each call, every cell observes its rows; after it, each
    row over its budget evicts, the cells' choices compacting the store in one pass."""

    def __init__(self, layer_idx: int, rows: Sequence[EvictingLayer], **kwargs):
        rows = list(rows)
        if not rows:
            raise ValueError("a row batch needs at least one row")
        first = rows[0]
        if any(row.seen != first.seen or row.calls != first.calls for row in rows) or first.calls < 1:
            raise ValueError("a row batch's rows must have seen the same prompt and be past their prefill")
        self.rows = rows
        self.row_evictions = [row.num_evictions for row in rows]
        self.row_steps = [row.steps_since_eviction for row in rows]
        self.row_peaks = [row.peak_length for row in rows]
        counts = [row.length for row in rows]
        store = self.store = EvictingLayer(layer_idx, FULL_PLAN, FULL_PLAN, **{**kwargs, "on_update": None})
        store.mask = rows_mask
        padded = TokenStore.padded(len(rows), capacity_for(max(counts), store._slack()), first.keys, first.values)
        for r, row in enumerate(rows):
            padded.write(r, 0, row.keys[0], row.values[0], row.positions[0], row.valid[0])
        store.hold_rows(padded, counts)
        store.device, store.is_initialized = first.keys.device, True
        store.seen, store.calls, store.num_evictions = first.seen, first.calls, max(self.row_evictions)
        self.row_groups = self._make_cells(counts)

    def _make_cells(self, counts: list[int]) -> list[RowCell]:
        members: dict[Any, list[int]] = {}
        for r, row in enumerate(self.rows):
            key = decoding_group(row, r)
            if key is not None:
                members.setdefault(key, []).append(r)
        cells = []
        for key, idx in members.items():
            pattern = key if isinstance(key, Pattern) else key[0]
            states = [self.rows[r].states.get(pattern) or PatternState() for r in idx]
            state = PatternState.stack(states, [counts[r] for r in idx])
            budgets = [self.rows[r].plans[DECODING].budget for r in idx]  # a row that evicts has a budget
            cells.append(RowCell(self.store, pattern, idx, budgets, state))
        return cells

    @property
    def counts(self) -> list[int]:
        """Tokens each row holds now (the store's per-row counts)."""
        assert self.store.counts is not None
        return self.store.counts

    # ------------------------------------------------- riding the store's calls
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing: the cells' tokens are the store's."""

    def cells(self) -> list:
        """None: no reconstruction pass or pool reaches a row batch (its rows are past their prefill)."""
        return []

    def entries(self) -> list:
        return []

    def begin_call(self, q_len: int, padding_mask: torch.Tensor | None, passing: bool) -> None:
        if padding_mask is not None:
            raise ValueError("a row batch does not support padding")
        for cell in self.row_groups:
            cell.show(self.store, [self.counts[r] for r in cell.rows], max(self.row_evictions[r] for r in cell.rows))

    def observers(self, passing: bool) -> list:
        return [(cell, None) for cell in self.row_groups]

    def observe_pass(self, *args) -> None:
        raise RuntimeError("polykv-search: a row batch takes no part in a reconstruction pass")

    def end_pass(self) -> None:
        """Nothing: a row batch takes no part in a pass."""

    def thaw(self) -> None:
        raise RuntimeError("polykv-search: a row batch made inside torch.inference_mode cannot be used outside it")

    def end_call(self, passing: bool) -> None:
        """Each row over its budget evicts as :func:`eviction_target` says, with its cell's pattern."""
        store, counts = self.store, self.counts
        self.row_steps = [s + 1 for s in self.row_steps]
        picks = []
        for cell in self.row_groups:
            targets = {}
            for j, r in enumerate(cell.rows):
                target = eviction_target(
                    DECODING,
                    counts[r],
                    cell.budgets[j],
                    interval=store.decode_interval,
                    mode=store.interval_mode,
                    steps_since_eviction=self.row_steps[r],
                )
                if target is not None:
                    targets[j] = target
            if targets:
                picks.append((cell, targets))
        if picks:
            self._evict(picks, counts)
        self.row_peaks = [max(p, c) for p, c in zip(self.row_peaks, self.counts)]

    def _evict(self, picks: list[tuple[RowCell, dict[int, int]]], counts: list[int]) -> None:
        """Keep ``targets[j]`` tokens of each cell's ``j``-th row (for the rows in ``targets``), chosen by the cell
        pattern's ``cache_update_rows``; then one compaction of the store serves every cell.

        Cells whose pattern uses the default batched variant (rank by ``selection_key``, then
        :func:`~polykv_search.patterns.selection.keep_per_row`) share one ``keep_per_row`` call: its
        rows are independent, so each row gets what its own cell's call would give it."""
        end = max(counts[c.rows[j]] for c, targets in picks for j in targets)  # the picked rows' slots
        parts: list[tuple[RowCell, list[int], list[int], tuple[torch.Tensor, torch.Tensor] | None]] = []
        shared_keys: list[torch.Tensor] = []
        shared_budgets: list[int] = []
        shared_counts: list[int] = []
        for cell, targets in picks:
            picked = sorted(targets)
            budgets = [targets[j] for j in picked]
            if cell.default_rows:
                rows = None if len(picked) == len(cell.rows) else picked  # None: the whole cell, no gather
                key = cell.pattern.selection_key(cell, cell.state, budgets, rows)
                shared_keys.append(_pad_to(key, end, NEG_INF))
                shared_budgets += budgets
                shared_counts += [counts[cell.rows[j]] for j in picked]
                parts.append((cell, picked, budgets, None))
            else:
                row_counts = [counts[cell.rows[j]] for j in picked]
                chosen = cell.pattern.cache_update_rows(cell, cell.state, picked, budgets, row_counts)
                parts.append((cell, picked, budgets, chosen))
        if shared_keys:
            key = shared_keys[0] if len(shared_keys) == 1 else torch.cat(shared_keys)
            shared = keep_per_row(key, shared_budgets, shared_counts)
        width = max(max(budgets) for _, _, budgets, _ in parts)
        keeps, kepts, rows, all_budgets, at = [], [], [], [], 0
        for cell, picked, budgets, own in parts:
            if own is None:
                own = (shared[0][at : at + len(picked)], shared[1][at : at + len(picked)])
                at += len(picked)
            keeps.append(_pad_to(own[0], width))
            kepts.append(_pad_to(own[1], width))
            rows += [cell.rows[j] for j in picked]
            all_budgets += budgets
        keep = keeps[0] if len(keeps) == 1 else torch.cat(keeps)  # [E, H, m], bool [E, 1, m]
        kept = kepts[0] if len(kepts) == 1 else torch.cat(kepts)
        keep, kept = _pad_to(keep, end), _pad_to(kept, end)
        self.store.compact_rows(rows, keep, kept, all_budgets)
        at = 0
        for cell, picked, _, _ in parts:
            part = slice(at, at + len(picked))
            at += len(picked)
            whole = len(picked) == len(cell.rows)
            cell.state.gather_rows(None if whole else picked, keep[part], kept[part], end)
        for r in rows:
            self.row_evictions[r] += 1
            self.row_steps[r] = 0
        self.store.num_evictions = max(self.row_evictions)

    def write_back(self) -> None:
        """Give every row its tokens, counters and pattern state again (compact, unpadded)."""
        store, counts = self.store, self.counts
        states = {r: row.states for r, row in enumerate(self.rows)}
        for cell in self.row_groups:
            for j, r in enumerate(cell.rows):
                states[r] = {cell.pattern: cell.state.take_row(j, counts[r])}
        for r, row in enumerate(self.rows):
            c = counts[r]
            row.restore(
                store.keys[r : r + 1, :, :c],
                store.values[r : r + 1, :, :c],
                store.positions[r : r + 1, :, :c],
                store.valid[r : r + 1, :, :c],
                seen=store.seen,
                calls=store.calls,
                num_evictions=self.row_evictions[r],
                steps_since_eviction=self.row_steps[r],
                peak_length=self.row_peaks[r],
                states=states[r],
            )


def decoding_group(row: EvictingLayer, r: int) -> Any:
    """The key of the cell row ``r`` joins in a row batch (rows with equal keys are scored and evict as one
    call), or None for a row that never evicts in decoding."""
    plan = row.plans[DECODING]
    if not plan.evicts:
        return None
    return plan.pattern if plan.pattern.batch_exact else (plan.pattern, r)


def _pad_to(t: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """``t`` right-padded along its last axis to ``width`` (``t`` itself when it is that wide)."""
    return t if t.shape[-1] == width else torch.nn.functional.pad(t, (0, width - t.shape[-1]), value=value)
