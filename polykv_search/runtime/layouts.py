"""Layouts: the functions that arrange one layer's cache as *kernel groups*, and the layer made of them.

A kernel group (:class:`KernelGroup`) is a layer of its own store and attention kernel (an
:class:`~polykv_search.runtime.layer.EvictingLayer`, or itself a :class:`GroupedLayer`) plus the batch rows and KV
heads of the layer it serves, and the cells that ride its store's calls, if any (a row batch's, a fan-out's). A
:class:`GroupedLayer` is a layer made of several: ``update`` hands each group its rows and heads of the new
keys/values, an attention call runs each group's own call on its rows and query heads (GQA), and the outputs
go back in batch-row and head order. Nothing is masked or padded across groups, so the KV bytes reported are
what the groups hold. Each layout is one function:

- :func:`cache_layer`: a strategy's layer: one group (a plain ``EvictingLayer``) or :func:`head_group_layer`;
- :func:`head_group_layer`: k head groups (e.g. retrieval heads that keep everything beside heads that keep
  sinks + recent tokens, DuoAttention's layout), each a dense ``[B, h_g, n_g, D]`` store with its own plans;
  a pooled allocation gets one group per KV head (:func:`per_head_groups`);
- :func:`row_batch`: rows decoded as one padded store whose cells are the rows that share a decoding pattern
  (:mod:`~polykv_search.runtime.row_batch`);
- :func:`row_parts`: a decoding batch's rows in row batches of their own order and length (a FullKV row of
  2,048 tokens beside rows of 64 need not pad them all to 2,048), a row of head groups a group of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from polykv_search.patterns.base import PassInputs
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layer import EvictingLayer, PhasePlan
from polykv_search.runtime.pooled import check_groups
from polykv_search.runtime.report import LayerReport, layer_report
from polykv_search.runtime.row_batch import RowCells, decoding_group

if TYPE_CHECKING:  # pragma: no cover
    from polykv_search.runtime.fanout import SharedCells

#: Padded token slots a split must save (rows x longest row, summed over parts) to be worth a second
#: kernel call per layer and step: about what one kernel call's fixed cost buys on a CPU.
SPLIT_MIN_SAVING = 4096


@dataclass(frozen=True)
class KernelGroup:
    """One kernel's share of a layer: its own ``layer``, the batch ``rows`` it holds, in its order (None:
    every row), and the KV ``heads`` it holds (None: every head). A group splits rows or heads, not both.
    ``riders``: cells that observe its calls without a kernel of their own (the fan-out's rows, fed the group's
    tokens, :func:`~polykv_search.runtime.fanout.fanout_layer`; a row batch's cells, :func:`row_batch`); the layer's
    cells are then theirs."""

    layer: RuntimeLayer
    rows: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    riders: SharedCells | RowCells | None = None


def query_heads(kv_heads: Sequence[int], groups: int) -> list[int]:
    """The query heads of KV heads ``kv_heads`` (``groups`` query heads per KV head, GQA)."""
    return [h * groups + i for h in kv_heads for i in range(groups)]


class GroupedLayer(RuntimeLayer):
    """One layer's cache made of kernel groups (see the module docstring). ``keys``/``values`` (what
    ``update`` returns to the model) are the first group's: only the runtime's attention function reads
    them, and it reads the groups. The groups' layers must be built detached (``on_update=None``)."""

    def __init__(self, layer_idx: int, kernel_groups: Sequence[KernelGroup], **kwargs):
        self.parts: list[RuntimeLayer] = []  # ``reset`` (run by the base's constructor) resets the parts
        super().__init__(layer_idx, **kwargs)
        self.kernel_groups = list(kernel_groups)
        self.parts = [g.layer for g in self.kernel_groups]
        rows = [list(g.rows) for g in self.kernel_groups if g.rows is not None]
        if rows and sorted(r for part in rows for r in part) != list(range(sum(map(len, rows)))):
            raise ValueError(f"layer {layer_idx}: row groups must hold every batch row once, got {rows}")
        split = [list(g.heads) for g in self.kernel_groups if g.heads is not None]
        if split and sorted(h for part in split for h in part) != list(range(self.num_kv_heads)):
            raise ValueError(
                f"layer {layer_idx}: head groups must cover KV heads 0..{self.num_kv_heads - 1} once each, got {split}"
            )
        if not self.kernel_groups or (rows and split):
            raise ValueError(f"layer {layer_idx}: kernel groups split the rows or the heads, not both")
        first = self.parts[0]
        if first.is_initialized:  # rows' layers and row batches hold tokens already (head groups are built empty)
            self.device = first.device
        self._rows = [None if g.rows is None else _index(g.rows, first.device) for g in self.kernel_groups]
        heads = [g.heads for g in self.kernel_groups]
        self._kv = [None if h is None else torch.tensor(h) for h in heads]
        self._q = [None if h is None else torch.tensor(query_heads(h, self.groups)) for h in heads]
        self.is_initialized = True

    keys = property(lambda self: self.parts[0].keys if self.parts else None, lambda self, t: None)
    values = property(lambda self: self.parts[0].values if self.parts else None, lambda self, t: None)

    # Tokens seen and calls are the groups' (they see every token and call): nothing to write back to a layer whose
    # groups were decoded elsewhere. Setting them sets every group's.
    seen = property(lambda self: self.parts[0].seen if self.parts else 0, lambda self, n: self._set_parts("seen", n))
    calls = property(lambda self: self.parts[0].calls if self.parts else 0, lambda self, n: self._set_parts("calls", n))

    def _set_parts(self, name: str, n: int) -> None:
        for part in self.parts:
            setattr(part, name, n)

    @property
    def length(self) -> int:
        """The longest group's slots (each group holds its own number of tokens)."""
        return max(part.length for part in self.parts)

    def reset(self) -> None:
        super().reset()
        for part in self.parts:
            part.reset()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        passing = self.parts[0].pass_prompt is not None
        for group, rows, kv in zip(self.kernel_groups, self._rows, self._kv):
            if group.riders is not None and not passing:  # riders hold the prompt, never the pass's tokens
                group.riders.update(key_states, value_states)
            group.layer.update(_take(key_states, rows, kv), _take(value_states, rows, kv))
        self.device = key_states.device
        self._notify_update(kwargs.get("kwargs"))
        return self.keys, self.values

    def attention_call_grouped(self, query: torch.Tensor, attend, inputs: PassInputs | None = None) -> torch.Tensor:
        """Each group's own call (``attend(layer, query, inputs)`` per store: hooks, kernel, eviction) on its rows
        and query heads of ``query``; outputs ``[B, q, Hq, D]`` put back in batch-row and head order."""
        out: torch.Tensor | None = None
        for group, rows, q in zip(self.kernel_groups, self._rows, self._q):
            part = group.layer
            if inputs is not None and rows is not None:
                raise RuntimeError("polykv-search: a decoding row split takes no part in a reconstruction pass")
            part_inputs = None if inputs is None else inputs if q is None else inputs.heads(q)
            if group.riders is not None:  # one store's call, its riders begun, observed and ended with it
                got = attend(part, _take(query, rows, q), part_inputs, group.riders)
            else:
                got = part.attention_call_grouped(_take(query, rows, q), attend, part_inputs)
            if rows is None and q is None:  # one group of every row and head
                out = got
                continue
            if out is None:
                out = got.new_empty(query.shape[0], got.shape[1], query.shape[1], got.shape[-1])
            if q is not None:
                out[:, :, q.to(query.device)] = got
            else:
                out[rows] = got
        assert out is not None  # a layer has at least one group
        return out

    def write_back(self) -> None:
        """Hand the rows of the row batches among the groups back to their own layers."""
        for group in self.kernel_groups:
            group.layer.write_back()
            if group.riders is not None:
                group.riders.write_back()

    def thaw(self) -> None:
        for group in self.kernel_groups:
            if group.riders is not None:
                group.riders.thaw()
            group.layer.thaw()

    def _map_batch(self, fn) -> None:
        if any(group.riders is not None for group in self.kernel_groups):
            super()._map_batch(fn)  # cells that ride a store do not move with it: refused
        for part in self.parts:
            part._map_batch(fn)

    def kv_bytes(self) -> int:
        return sum(part.kv_bytes() for part in self.parts)

    def cells(self) -> list[tuple[EvictingLayer, tuple[int, ...] | None]]:
        """The head groups' cells, or the riders' (a decoding batch split by rows: none; its rows' are theirs)."""
        out: list[tuple[EvictingLayer, tuple[int, ...] | None]] = []
        if self.kernel_groups[0].rows is not None:
            return out
        for group in self.kernel_groups:
            for cell, heads in group.layer.cells() if group.riders is None else group.riders.cells():
                if group.heads is not None:
                    heads = group.heads if heads is None else tuple(group.heads[h] for h in heads)
                out.append((cell, heads))
        return out

    def entries(self) -> list[list[EvictingLayer]]:
        """One entry per rider (the scorer's shared context layer: one per row), else the layer's cells."""
        riders = [entry for g in self.kernel_groups if g.riders is not None for entry in g.riders.entries()]
        return riders or super().entries()

    def begin_pass(self, prompt_len: int) -> None:
        """Every group's store enters the pass (the riders hold no pass tokens: their stores' calls see them)."""
        if not self.cells():  # a decoding batch split by rows
            super().begin_pass(prompt_len)
        for part in self.parts:
            part.begin_pass(prompt_len)

    def end_pass(self) -> None:
        for group in self.kernel_groups:
            group.layer.end_pass()
            if group.riders is not None:
                group.riders.end_pass()

    def layer_report(self) -> LayerReport:
        """What the groups hold: bytes summed; tokens and budgets as the mean over KV heads."""
        reports = [layer_report(part) for part in self.parts]
        sizes = [part.num_kv_heads for part in self.parts]

        def mean(values) -> int | None:
            if any(v is None for v in values):
                return None
            return round(sum(v * s for v, s in zip(values, sizes)) / sum(sizes))

        return LayerReport(
            layer=self.layer_idx,
            seen=self.seen,
            kept=round(sum(r.kept * s for r, s in zip(reports, sizes)) / sum(sizes)),
            kv_bytes=sum(r.kv_bytes for r in reports),
            peak_kv_bytes=sum(r.peak_kv_bytes for r in reports),
            full_kv_bytes=sum(r.full_kv_bytes for r in reports),
            prefill_budget=mean([r.prefill_budget for r in reports]),
            decoding_budget=mean([r.decoding_budget for r in reports]),
        )


def _index(rows: Sequence[int], device) -> slice | torch.Tensor:
    rows = list(rows)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.tensor(rows, device=device)


def _take(t: torch.Tensor, rows: slice | torch.Tensor | None, heads: torch.Tensor | None) -> torch.Tensor:
    """``t``'s batch ``rows`` (dim 0) or ``heads`` (dim 1); ``t`` itself when neither."""
    if heads is not None:
        return t.index_select(1, heads.to(t.device))
    if rows is None or isinstance(rows, slice):
        return t if rows is None else t[rows]
    return t.index_select(0, rows)


# ------------------------------------------------------------------------------- head groups
@dataclass(frozen=True)
class HeadGroupPlan:
    """KV heads ``heads`` of a layer and the ``(prefill, decoding)`` plans they apply together."""

    heads: tuple[int, ...]
    prefill: PhasePlan
    decoding: PhasePlan


def head_group_layer(
    layer_idx: int, head_groups: Sequence[HeadGroupPlan], *, defer_prefill: bool = False, **kwargs
) -> GroupedLayer:
    """A layer whose KV heads are split into ``head_groups``, each an ``EvictingLayer`` over its own heads."""
    check_groups(head_groups)
    sub = {**kwargs, "on_update": None}
    groups = [
        KernelGroup(
            EvictingLayer(
                layer_idx, g.prefill, g.decoding, defer_prefill=defer_prefill, **{**sub, "num_kv_heads": len(g.heads)}
            ),
            heads=tuple(g.heads),
        )
        for g in head_groups
    ]
    return GroupedLayer(layer_idx, groups, **kwargs)


def per_head_groups(prefill: PhasePlan, decoding: PhasePlan, num_kv_heads: int) -> list[HeadGroupPlan] | None:
    """One group per KV head when a plan pools its tokens over heads (kvzip's ``allocation="layer"`` or
    ``"model"``): each head then holds its own number of tokens in a store of its own; else None."""
    if not any(plan.evicts and plan.pattern.pooled is not None for plan in (prefill, decoding)):
        return None
    return [HeadGroupPlan((h,), prefill, decoding) for h in range(num_kv_heads)]


def cache_layer(
    layer_idx: int,
    prefill: PhasePlan,
    decoding: PhasePlan,
    head_groups: Sequence[HeadGroupPlan] | None = None,
    *,
    defer_prefill: bool = False,
    **kwargs,
) -> RuntimeLayer:
    """The cache layer of one layer's plans: :func:`head_group_layer` of its ``head_groups`` (or of one group
    per KV head, :func:`per_head_groups`), else an :class:`EvictingLayer`."""
    head_groups = head_groups or per_head_groups(prefill, decoding, kwargs["num_kv_heads"])
    if head_groups:
        return head_group_layer(layer_idx, head_groups, defer_prefill=defer_prefill, **kwargs)
    return EvictingLayer(layer_idx, prefill, decoding, defer_prefill=defer_prefill, **kwargs)


# -------------------------------------------------------------------------------- row splits
def best_split(lengths: Sequence[int], min_saving: int = SPLIT_MIN_SAVING) -> int | None:
    """Where to cut consecutive rows of ``lengths`` tokens into two parts (the second part's first row),
    or None when one padded part (``len(lengths) * max(lengths)`` slots) is not at least ``min_saving``
    slots dearer than the best cut."""
    r = len(lengths)
    padded = r * max(lengths, default=0)
    best, at = padded, None
    for k in range(1, r):
        cost = k * max(lengths[:k]) + (r - k) * max(lengths[k:])
        if cost < best:
            best, at = cost, k
    return at if at is not None and padded - best >= min_saving else None


def layer_slots(lengths: Sequence[int], min_saving: int | None) -> int:
    """Slots one layer's kernel attends over for rows of ``lengths``: padded to the longest, or split
    by :func:`best_split` (``min_saving`` None: never split)."""
    r, padded = len(lengths), len(lengths) * max(lengths, default=0)
    cut = None if min_saving is None else best_split(lengths, min_saving)
    if cut is None:
        return padded
    return cut * max(lengths[:cut]) + (r - cut) * max(lengths[cut:])


def by_decoding_group(members: Sequence[EvictingLayer]) -> list[int]:
    """``members``' indices reordered so that the rows of each :func:`decoding_group` (the rows a
    row batch's cell scores and evicts as one call) are consecutive: a cell's view is then a
    slice of the store, not a gather of it. Groups keep their first row's order; rows that never evict
    in decoding go last."""
    rank: dict = {}
    keys = [decoding_group(member, i) for i, member in enumerate(members)]
    for key in keys:
        if key is not None:
            rank.setdefault(key, len(rank))
    return sorted(range(len(members)), key=lambda i: len(rank) if keys[i] is None else rank[keys[i]])


def row_group(
    layer_idx: int, members: Sequence[EvictingLayer], rows: tuple[int, ...] | None = None, heads=None, **kwargs
) -> KernelGroup:
    """A row batch as a kernel group serving batch ``rows`` or KV ``heads`` of a layer: a padded store of the
    ``members``' tokens whose riders are its cells (:class:`~polykv_search.runtime.row_batch.RowCells`)."""
    cells = RowCells(layer_idx, members, **kwargs)
    return KernelGroup(cells.store, rows=rows, heads=heads, riders=cells)


def row_batch(layer_idx: int, rows: Sequence[EvictingLayer], **kwargs) -> GroupedLayer:
    """Rows (detached single-sequence layers past their prefill) decoded as one padded batch: one
    :func:`row_group`, every row kept as it keeps alone."""
    return GroupedLayer(layer_idx, [row_group(layer_idx, rows, **kwargs)], **kwargs)


def row_parts(layer_idx: int, members: Sequence[RuntimeLayer], split: int | None, **kwargs) -> RuntimeLayer:
    """One layer of a decoding batch over ``members`` (the rows' own layers, in batch order): runs of
    consecutive :class:`EvictingLayer` rows share a :func:`row_group` (cut in two by :func:`best_split`
    when that saves ``split`` padded slots; None: never), its rows in :func:`by_decoding_group` order, so that
    a pattern group's rows are a slice of its store; any other row's layer (head groups; a pooled allocation's
    heads of different lengths, ``EvictingLayer.ragged``) is a group of its own. A single row batch whose rows
    need no reordering is one :func:`row_batch`; else a :class:`GroupedLayer` of row groups."""

    def pieces(run: list[int]) -> list[list[int]]:
        cut = None if split is None else best_split([members[i].length for i in run], split)
        return [run] if cut is None else [run[:cut], run[cut:]]

    rows_of = {i: row for i, m in enumerate(members) if (row := m.as_row()) is not None}

    def grouped(piece: list[int]) -> list[int]:
        return [piece[i] for i in by_decoding_group([rows_of[i] for i in piece])]

    everyone = list(range(len(members)))
    if len(rows_of) == len(members):
        (only, *more) = pieces(everyone)
        if not more and grouped(only) == only:
            return row_batch(layer_idx, [rows_of[i] for i in everyone], **kwargs)
    sub = {**kwargs, "on_update": None}
    groups: list[KernelGroup] = []
    run: list[int] = []
    for i in [*everyone, None]:  # None closes the last run
        if i is not None and i in rows_of:
            run.append(i)
            continue
        for piece in pieces(run) if run else []:
            rows = grouped(piece)
            groups.append(row_group(layer_idx, [rows_of[r] for r in rows], rows=tuple(rows), **sub))
        run = []
        if i is not None:
            groups.append(KernelGroup(members[i], rows=(i,)))
    return GroupedLayer(layer_idx, groups, **kwargs)
