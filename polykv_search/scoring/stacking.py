"""One layer of a decoding batch in which several rows split their KV heads the same way.

:func:`~polykv_search.runtime.layouts.row_parts` gives a row with head groups a kernel group of its own: each of
its head groups is a one-row store with its own attention call and eviction, at every step. A batch of S
samples of E such entries then makes ``S * E * groups`` small calls per split layer and step where a
layer-level entry adds none (the decode suite's head-group strategies: DuoAttention-like layers of a
streaming group beside a keep-all or keep-prompt group).

:func:`stacked_layer` gives the rows whose layers split the KV heads into the same groups (the same head sets,
in any order; each group a plain, non-pooled :class:`~polykv_search.runtime.EvictingLayer`) one kernel group
together: per head set, one row batch (:func:`~polykv_search.runtime.layouts.row_group`) over those rows' groups, which
scores and evicts rows of one decoding pattern as one call, each row to its own budget. A row batch keeps every
row's tokens as the row keeps them alone (its module's contract), so every row keeps the same tokens; only the
number of calls changes. The other rows go through ``row_parts`` as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layouts import GroupedLayer, KernelGroup, row_group, row_parts

HeadSplit = tuple[tuple[int, ...], ...]


def head_split(layer: RuntimeLayer) -> HeadSplit | None:
    """The sorted head sets of ``layer``'s cells when :func:`shared_head_groups` can hold it (every cell a row of a
    row batch over some of the heads, past its prefill); else None."""
    cells = layer.cells()
    heads = [h for cell, h in cells if h is not None and cell.as_row() is not None and cell.calls >= 1]
    return tuple(sorted(heads)) if cells and len(heads) == len(cells) else None


def shared_head_groups(layer_idx: int, rows: Sequence[RuntimeLayer], **kwargs) -> GroupedLayer:
    """Rows (layers of one :func:`head_split`) as head groups, each a row batch of every row's cell over those heads.
    Its ``write_back`` hands the cells their rows' tokens; the rows' counters are their cells'."""
    split = head_split(rows[0])
    if split is None or any(head_split(row) != split for row in rows):
        raise ValueError(f"layer {layer_idx}: shared head groups need rows of one head split")
    cells = [{heads: cell for cell, heads in row.cells()} for row in rows]
    batches = [
        row_group(layer_idx, [row[heads] for row in cells], heads=heads, **{**kwargs, "num_kv_heads": len(heads)})
        for heads in split
    ]
    return GroupedLayer(layer_idx, batches, **kwargs)


def stacked_layer(layer_idx: int, members: Sequence[RuntimeLayer], split: int | None, **kwargs) -> RuntimeLayer:
    """Layer ``layer_idx`` of a decoding batch over ``members`` (the rows' own layers, in batch order): the rows
    of each :func:`head_split` shared by two or more rows in one :func:`shared_head_groups`, every other row
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
        return shared_head_groups(layer_idx, list(members), **kwargs)
    sub = {**kwargs, "on_update": None}
    groups = []
    if rest:
        groups.append(KernelGroup(row_parts(layer_idx, [members[i] for i in rest], split, **sub), rows=tuple(rest)))
    for rows in shared:
        groups.append(KernelGroup(shared_head_groups(layer_idx, [members[i] for i in rows], **sub), rows=tuple(rows)))
    return GroupedLayer(layer_idx, groups, **kwargs)
