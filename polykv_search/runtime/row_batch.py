"""`RowBatchLayer`: single-sequence cache layers decoded as one batch, evicting row groups at once.

The scorer decodes many entries together. Each row keeps its own tokens, decoding pattern and budget,
but rows live in one padded store (row ``r``'s ``counts[r]`` tokens in slots ``0..counts[r]-1``,
the rest invalid), and the rows that share a decoding pattern form a *group* whose hooks, scores and
evictions run as one batched call with per-row budgets. Patterns whose batched scores are not the
per-row scores (``Pattern.batch_exact = False``, e.g. seeded random draws) get a group per row.

Every row keeps exactly the tokens it would keep alone (:class:`~polykv_search.runtime.EvictingLayer`
with the same plans): scores of valid tokens do not depend on the padding, padding is never kept,
and protection and selection follow each row's own (interval) budget. :meth:`RowBatchLayer.write_back`
hands the rows their state again (when rows leave the batch, and at the end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polykv_search.patterns.base import NEG_INF, POS_INF, Pattern
from polykv_search.runtime.layer import DECODING, FULL_PLAN, EvictingLayer
from polykv_search.runtime.row_select import keep_per_row
from polykv_search.runtime.row_states import fit_tokens, row_state, stack_states
from polykv_search.runtime.storage import TokenStore, capacity_for


def _newest_only(layer: EvictingLayer, query_positions) -> bool:
    return (
        isinstance(query_positions, range)
        and len(query_positions) == 1
        and query_positions.start == layer.seen - 1
        and layer.sliding_window is None
    )


class _RowsMask:
    """``allowed`` for rows stored compactly (row ``r`` valid in slots ``0..count-1`` on every head): the
    newest query sees exactly the valid slots, one ``[R, 1, 1, n]`` mask for all heads."""

    def allowed(self, query_positions):
        if not self.all_valid and _newest_only(self, query_positions):
            return self._valid[:, :1, None, :]
        return super().allowed(query_positions)


class _GroupView(_RowsMask, EvictingLayer):
    """The layer a group's pattern sees: its rows' slots of the batch store (no padding queries)."""

    #: builds ``values`` on first read: no pattern hook reads them, so no copy per call
    _take_values = None

    @property
    def values(self) -> torch.Tensor | None:
        if self._values is None and self._take_values is not None:
            self._values = self._take_values()
        return self._values

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._assign("_values", tensor)

    def query_valid(self, q_len: int) -> torch.Tensor | None:
        return None

    def attention_probs(self, query, query_positions, upto=None):
        probs = super().attention_probs(query, query_positions, upto)
        # A query that sees none of a row's keys (a SnapKV window query older than every kept token)
        # has NaN probabilities; alone, the row's window mask zeroes all of them, but here they would
        # also reach the padding slots (and SnapKV's pooling). Zero is what the row alone ends with.
        return probs if self.all_valid else probs.nan_to_num_(0.0)


@dataclass
class _Group:
    pattern: Pattern
    rows: list[int]
    budgets: list[int]
    state: dict[str, Any]
    index: torch.Tensor | slice
    view: _GroupView


class RowBatchLayer(_RowsMask, EvictingLayer):
    """Rows (detached single-sequence layers in their decoding phase) shown as one right-padded batch.

    The attention kernel sees ``keys``/``values`` ``[R, Hkv, N, D]`` with ``N`` the longest row and
    the padding invalid (position -1). The rows' layers are not touched until :meth:`write_back`.
    """

    def __init__(self, layer_idx: int, rows: Sequence[EvictingLayer], **kwargs):
        super().__init__(layer_idx, FULL_PLAN, FULL_PLAN, **kwargs)
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
        store = _empty_store(first, len(rows), capacity_for(n, self._slack()))
        for r, row in enumerate(rows):
            c = self.counts[r]
            store.keys[r, :, :c] = row.keys[0]
            store.values[r, :, :c] = row.values[0]
            store.positions[r, :, :c] = row.positions[0]
            store.valid[r, :, :c] = row.valid[0]
        self._batch = store
        self.row_groups = self._make_groups(rows)
        self._dispatch = _GroupDispatch(self)
        self._refresh()

    # ------------------------------------------------------------------ set-up
    def _make_groups(self, rows: list[EvictingLayer]) -> list[_Group]:
        members: dict[Any, list[int]] = {}
        for r, row in enumerate(rows):
            plan = row.plans[DECODING]
            if plan.evicts:
                key = plan.pattern if plan.pattern.batch_exact else (plan.pattern, r)
                members.setdefault(key, []).append(r)
        groups = []
        for key, idx in members.items():
            pattern = key if isinstance(key, Pattern) else key[0]
            contiguous = idx == list(range(idx[0], idx[-1] + 1))
            index = slice(idx[0], idx[-1] + 1) if contiguous else torch.tensor(idx, device=self.device)
            states = [rows[r].states.get(pattern, {}) for r in idx]
            state = stack_states(states, [self.counts[r] for r in idx])
            view = _GroupView(self.layer_idx, FULL_PLAN, rows[idx[0]].plans[DECODING], **self._view_kwargs())
            budgets = [rows[r].plans[DECODING].budget for r in idx]
            groups.append(_Group(pattern, idx, budgets, state, index, view))
        return groups

    def _view_kwargs(self) -> dict:
        return {
            "num_kv_heads": self.num_kv_heads,
            "groups": self.groups,
            "scaling": self.scaling,
            "sliding_window": self.sliding_window,
            "decode_interval": self.decode_interval,
            "interval_mode": self.interval_mode,
        }

    # ------------------------------------------------------- cache layer API
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        store = self._batch
        n_max = max(self.counts)
        if n_max + q > store.capacity:
            store = self._batch = _grown(store, n_max, capacity_for(n_max + q, self._slack()))
        lo = min(self.counts)
        if lo == n_max:  # every row the same length: one slice
            store.keys[:, :, lo : lo + q] = key_states
            store.values[:, :, lo : lo + q] = value_states
            store.positions[:, :, lo : lo + q] = torch.arange(self.seen, self.seen + q, device=self.device)
            store.valid[:, :, lo : lo + q] = True
        else:
            r = len(self.counts)
            slot = torch.tensor(self.counts, device=self.device)[:, None] + torch.arange(q, device=self.device)
            rows = torch.arange(r, device=self.device)[:, None]
            store.keys[rows, :, slot] = key_states.transpose(1, 2)
            store.values[rows, :, slot] = value_states.transpose(1, 2)
            store.positions[rows, :, slot] = torch.arange(self.seen, self.seen + q, device=self.device)[None, :, None]
            store.valid[rows, :, slot] = True
        self.counts = [c + q for c in self.counts]
        self.seen += q
        self._refresh()
        if self._on_update is not None:
            self._on_update(self)
        return self._keys, self._values

    def begin_call(self, q_len: int, padding_mask) -> None:
        if padding_mask is not None:
            raise ValueError("RowBatchLayer does not support padding")
        self.query_range = range(self.seen - q_len, self.seen)
        for group in self.row_groups:
            self._point_view(group)

    def observers(self):
        return [(self._dispatch, {})] if self.row_groups else []

    def end_call(self) -> None:
        self.calls += 1
        k = self.decode_interval
        self.row_steps = [s + 1 for s in self.row_steps]
        picks = []
        for group in self.row_groups:
            targets = {}
            for j, r in enumerate(group.rows):
                budget, n = group.budgets[j], self.counts[r]
                if n <= budget:
                    continue
                if self.interval_mode == "within":
                    targets[j] = budget - min(k, budget) + 1
                elif self.row_steps[r] >= k:
                    targets[j] = budget
            if targets:
                picks.append((group, targets))
        if picks:
            self._evict(picks)
        self.row_peaks = [max(p, c) for p, c in zip(self.row_peaks, self.counts)]
        self._refresh()

    # ------------------------------------------------------------ eviction
    def _evict(self, picks: list[tuple[_Group, dict[int, int]]]) -> None:
        """Keep ``targets[j]`` tokens of each group's ``j``-th row (for the rows in ``targets``): every
        group scores its rows, then one selection and one compaction serve all of them."""
        end = max(self.counts[g.rows[j]] for g, targets in picks for j in targets)  # the picked rows' slots
        keys, rows, budgets, parts = [], [], [], []
        for group, targets in picks:
            picked = sorted(targets)
            parts.append((group, picked))
            key = self._group_key(group, [targets[j] for j in picked], picked)
            keys.append(torch.nn.functional.pad(key, (0, end - key.shape[-1]), value=NEG_INF))
            rows += [group.rows[j] for j in picked]
            budgets += [targets[j] for j in picked]
        key = keys[0] if len(keys) == 1 else torch.cat(keys)
        keep, kept = keep_per_row(key, budgets, [self.counts[r] for r in rows])  # [E, H, m], bool [E, 1, m]
        keep = torch.nn.functional.pad(keep, (0, end - keep.shape[-1]))
        kept = torch.nn.functional.pad(kept, (0, end - kept.shape[-1]))
        self._compact(torch.tensor(rows, device=self.device), keep, kept)
        at = 0
        for group, picked in parts:
            part = slice(at, at + len(picked))
            at += len(picked)
            self._gather_tokens(group, picked, keep[part], kept[part], end)
        for r, b in zip(rows, budgets):
            self.counts[r] = b
            self.row_evictions[r] += 1
            self.row_steps[r] = 0

    def _group_key(self, group: _Group, budget_list: list[int], picked: list[int]) -> torch.Tensor:
        """Selection keys ``[len(picked), H, n]`` of the group's ``picked`` rows: the pattern's scores,
        protection (per row, at its own target) as +inf, padding as -inf."""
        view, pattern = group.view, group.pattern
        score = pattern.score(view, group.state).float()  # [R_g, H, n]
        sel = None if len(picked) == len(group.rows) else torch.tensor(picked, device=self.device)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t if sel is None else t.index_select(0, sel)

        distinct = sorted(set(budget_list))
        budgets = torch.tensor(budget_list, device=self.device) if len(distinct) > 1 else None
        protected = None
        for t in distinct:  # protection depends on each row's (interval) budget
            mask = pattern.protected(view, t)
            if mask is None:
                continue
            mask = take(mask.expand(score.shape))
            if budgets is not None:
                mask = mask & (budgets == t)[:, None, None]
            protected = mask if protected is None else protected | mask
        key = take(score)
        if protected is not None:
            key = key.masked_fill(protected, POS_INF)
        if not view.all_valid:
            key = key.masked_fill(~take(view.valid), NEG_INF)
        return key

    @staticmethod
    def _gather_tokens(group: _Group, picked: list[int], keep, kept, end: int) -> None:
        """The group's token-axis pattern state follows its picked rows' kept slots (``keep`` covers
        slots ``0..end-1``; the group's other rows, possibly longer, keep theirs)."""
        whole = len(picked) == len(group.rows)
        for name, tensor in group.state.get("token", {}).items():
            if whole:
                fresh = fit_tokens(tensor, end).gather(-1, keep).masked_fill_(~kept, 0)
            else:
                sel = torch.tensor(picked, device=tensor.device)
                fresh = fit_tokens(tensor, max(end, tensor.shape[-1]))
                rows = fit_tokens(fresh.index_select(0, sel), end).gather(-1, keep).masked_fill_(~kept, 0)
                fresh[sel] = fit_tokens(rows, fresh.shape[-1])
            group.state["token"][name] = fresh

    def _compact(self, rows: torch.Tensor, keep: torch.Tensor, kept: torch.Tensor) -> None:
        """Rewrite slots ``0..end-1`` of store ``rows``: the ``keep`` slots first, then padding."""
        store = self._batch
        r, h, cap = store.keys.shape[:3]
        base = (rows[:, None, None] * h + torch.arange(h, device=rows.device)[None, :, None]) * cap
        src = (base + keep).reshape(-1)
        dst = (base + torch.arange(keep.shape[-1], device=rows.device)).reshape(-1)
        for buf in (store.keys, store.values):
            flat = buf.view(r * h * cap, buf.shape[-1])
            flat.index_copy_(0, dst, flat.index_select(0, src))
        flat = store.positions.view(-1)
        flat.index_copy_(0, dst, flat.index_select(0, src).view_as(keep).masked_fill_(~kept, -1).reshape(-1))
        store.valid.view(-1).index_copy_(0, dst, kept.expand_as(keep).reshape(-1))

    # ------------------------------------------------------------- views
    def _refresh(self) -> None:
        n = max(self.counts)
        self._keys, self._values, self._positions, self._valid = self._batch.views(n)
        self._all_valid = min(self.counts) == n
        self.num_evictions = max(self.row_evictions)

    def _point_view(self, group: _Group) -> None:
        """Point the group's view at its rows' slots: the rows' longest prefix of the store."""
        view, store = group.view, self._batch
        n = max(self.counts[r] for r in group.rows)
        take = (lambda t: t[group.index, :, :n]) if isinstance(group.index, slice) else None
        if take is None:
            idx = group.index
            take = lambda t: t[:, :, :n].index_select(0, idx)  # noqa: E731
        view._keys, view._values = take(store.keys), None
        view._take_values = lambda: take(store.values)
        view._positions, view._valid = take(store.positions), take(store.valid)
        view._store = None
        view._all_valid = all(self.counts[r] == n for r in group.rows)
        view.device, view.is_initialized = self.device, True
        view.seen, view.calls, view.query_range = self.seen, self.calls, self.query_range
        view.num_evictions = max(self.row_evictions[r] for r in group.rows)
        for name, tensor in group.state.get("token", {}).items():
            group.state["token"][name] = fit_tokens(tensor, n)

    def write_back(self) -> None:
        """Give every row its tokens, counters and pattern state again (compact, unpadded)."""
        store = self._batch
        for r, row in enumerate(self.rows):
            c = self.counts[r]
            row._keys, row._values = store.keys[r : r + 1, :, :c], store.values[r : r + 1, :, :c]
            row._positions, row._valid = store.positions[r : r + 1, :, :c], store.valid[r : r + 1, :, :c]
            row._store, row._all_valid = None, True
            row.seen, row.calls = self.seen, self.calls
            row.num_evictions, row.steps_since_eviction = self.row_evictions[r], self.row_steps[r]
            row.peak_length = self.row_peaks[r]
        for group in self.row_groups:
            for j, r in enumerate(group.rows):
                state = row_state(group.state, len(group.rows), j, self.counts[r])
                self.rows[r].states = {group.pattern: state}


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


def _empty_store(like: EvictingLayer, r: int, capacity: int) -> TokenStore:
    h, d, dv = like.keys.shape[1], like.keys.shape[-1], like.values.shape[-1]
    dev = like.keys.device
    # zeros, not empty: padded slots are masked out, but must be finite (0 * NaN is NaN)
    return TokenStore(
        torch.zeros(r, h, capacity, d, dtype=like.keys.dtype, device=dev),
        torch.zeros(r, h, capacity, dv, dtype=like.values.dtype, device=dev),
        torch.full((r, h, capacity), -1, dtype=torch.long, device=dev),
        torch.zeros(r, h, capacity, dtype=torch.bool, device=dev),
    )


def _grown(store: TokenStore, n: int, capacity: int) -> TokenStore:
    r, h, _, d = store.keys.shape
    new = TokenStore(
        store.keys.new_zeros(r, h, capacity, d),
        store.values.new_zeros(r, h, capacity, store.values.shape[-1]),
        store.positions.new_full((r, h, capacity), -1),
        store.valid.new_zeros(r, h, capacity),
    )
    for a, b in zip((new.keys, new.values, new.positions, new.valid), store.views(n)):
        a[:, :, :n] = b
    return new
