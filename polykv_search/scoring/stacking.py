"""One layer of a decoding batch in which several rows split their KV heads the same way.

:func:`~polykv_search.runtime.layouts.row_parts` gives a row with head groups a kernel group of its own: each of
its head groups is a one-row store with its own attention call and eviction, at every step. A batch of S
samples of E such entries then makes ``S * E * groups`` small calls per split layer and step where a
layer-level entry adds none (the decode suite's head-group strategies: DuoAttention-like layers of a
streaming group beside a keep-all or keep-prompt group).

:func:`stacked_layer` gives the rows whose layers split the KV heads into the same groups (the same head sets,
in any order; each group a plain, non-pooled :class:`~polykv_search.runtime.EvictingLayer`) one kernel group
together: per head set, one :class:`~polykv_search.runtime.RowBatchLayer` over those rows' groups, which
scores and evicts rows of one decoding pattern as one call, each row to its own budget. A row batch keeps every
row's tokens as the row keeps them alone (its module's contract), so every row keeps the same tokens; only the
number of calls changes. The other rows go through ``row_parts`` as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from polykv_search.runtime import EvictingLayer, RowBatchLayer
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layouts import GroupedLayer, KernelGroup, row_parts

HeadSplit = tuple[tuple[int, ...], ...]


def head_split(layer: RuntimeLayer) -> HeadSplit | None:
    """The sorted head sets of ``layer``'s head groups when a :class:`SharedHeadGroups` can hold it (every group
    one plain, non-pooled ``EvictingLayer`` over some heads, past its prefill); else None."""
    if not isinstance(layer, GroupedLayer):
        return None
    groups = layer.kernel_groups
    plain = all(
        g.heads is not None and type(g.layer) is EvictingLayer and not g.layer.ragged and g.layer.calls >= 1
        for g in groups
    )
    return tuple(sorted(g.heads for g in groups)) if plain else None  # type: ignore[misc]


class SharedHeadGroups(GroupedLayer):
    """Rows (layers of one :func:`head_split`) as head groups, each a row batch of every row's group over those
    heads. :meth:`write_back` hands the groups their rows' tokens and the rows' own layers their counters."""

    def __init__(self, layer_idx: int, rows: Sequence[GroupedLayer], **kwargs):
        self.members = list(rows)
        split = head_split(self.members[0])
        if split is None or any(head_split(row) != split for row in self.members):
            raise ValueError(f"layer {layer_idx}: shared head groups need rows of one head split")
        parts = [{g.heads: g.layer for g in row.kernel_groups} for row in self.members]
        batches = [
            KernelGroup(
                RowBatchLayer(layer_idx, [part[heads] for part in parts], **{**kwargs, "num_kv_heads": len(heads)}),
                heads=heads,
            )
            for heads in split
        ]
        super().__init__(layer_idx, batches, **kwargs)
        self.device = batches[0].layer.device

    def write_back(self) -> None:
        super().write_back()
        for row in self.members:
            row.seen, row.calls = self.seen, self.calls


def stacked_layer(layer_idx: int, members: Sequence[RuntimeLayer], split: int | None, **kwargs) -> RuntimeLayer:
    """Layer ``layer_idx`` of a decoding batch over ``members`` (the rows' own layers, in batch order): the rows
    of each :func:`head_split` shared by two or more rows in one :class:`SharedHeadGroups`, every other row
    through :func:`~polykv_search.runtime.layouts.row_parts` (``split``: its row-cut setting)."""
    by_split: dict[HeadSplit, list[int]] = {}
    for i, member in enumerate(members):
        key = head_split(member)
        if key is not None:
            by_split.setdefault(key, []).append(i)
    shared = [rows for rows in by_split.values() if len(rows) > 1]
    if not shared:
        return row_parts(layer_idx, members, split, **kwargs)
    taken = {i for rows in shared for i in rows}
    rest = [i for i in range(len(members)) if i not in taken]
    if not rest and len(shared) == 1:  # every row of one split: the shared layer is the layer
        return SharedHeadGroups(layer_idx, list(members), **kwargs)
    sub = {**kwargs, "on_update": None}
    groups = []
    if rest:
        groups.append(KernelGroup(row_parts(layer_idx, [members[i] for i in rest], split, **sub), rows=tuple(rest)))
    groups += [
        KernelGroup(SharedHeadGroups(layer_idx, [members[i] for i in rows], **sub), rows=tuple(rows)) for rows in shared
    ]
    return GroupedLayer(layer_idx, groups, **kwargs)
