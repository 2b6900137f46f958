"""`RowSplitLayer`: one decoding batch whose rows sit in row batches of their own order and length.

A FullKV row holding a 2,048-token prompt beside rows that hold 64 tokens: in one padded store every
row would attend over 2,048 slots; in a batch of its own the long row pays a pass over the model's
weights of its own. Here the rows share the model's forward (one weights pass for all of them) and
each *part* (consecutive rows) is its own :class:`~polykv_search.runtime.row_batch.RowBatchLayer`:
its own store, pattern hooks, evictions and attention kernel over its own longest row. A part keeps
exactly what its rows keep alone, so the split changes no result, only the padding.

The same layer also reorders a part's rows by decoding pattern group (:func:`by_decoding_group`), so
that each group's rows are consecutive in the part's store: a group's pattern then reads slices of
the store instead of gathering its rows every step. Each layer has its own order (the patterns differ
per layer); queries are reordered on the way in and outputs put back in batch order on the way out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polykv_search.patterns.base import PassInputs
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layer import EvictingLayer
from polykv_search.runtime.row_batch import RowBatchLayer, decoding_group

#: Padded token slots a split must save (rows x longest row, summed over parts) to be worth a second
#: kernel call per layer and step: about what one kernel call's fixed cost buys on a CPU.
SPLIT_MIN_SAVING = 4096


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


class RowSplitLayer(RuntimeLayer):
    """A decoding batch's rows as *parts*, each a layer of its own (see the module docstring): a
    :class:`RowBatchLayer` of some rows, or one row's own layer (e.g. a
    :class:`~polykv_search.runtime.head_groups.HeadGroupLayer`, whose head groups keep their own stores).
    Each part is given the batch rows it holds, in the order it holds them (together a permutation of
    the batch). ``update`` hands each part its rows; the attention function calls
    :meth:`attention_call_grouped`, which runs each part's own attention call on its rows of the
    queries and puts the outputs back in batch row order. ``keys``/``values`` are the first part's:
    only the runtime's attention function reads them, and it reads the parts. Parts must be built
    detached (``on_update=None``): this layer notifies."""

    def __init__(self, layer_idx: int, parts: Sequence[tuple[RuntimeLayer, Sequence[int]]], **kwargs):
        super().__init__(layer_idx, **kwargs)
        if not parts or any(len(rows) < 1 for _, rows in parts):
            raise ValueError(f"a row split needs parts of at least one row each, got {[list(r) for _, r in parts]}")
        order = [r for _, rows in parts for r in rows]
        identity = list(range(len(order)))
        if sorted(order) != identity:
            raise ValueError(f"a row split's parts must hold every batch row once, got {order}")
        self.parts = [part for part, _ in parts]
        first = self.parts[0]
        self.device, self.seen, self.calls = first.device, first.seen, first.calls
        self._rows = [_rows_index(rows, self.device) for _, rows in parts]
        inverse = None if order == identity else sorted(identity, key=order.__getitem__)
        self._inverse = None if inverse is None else torch.tensor(inverse, device=self.device)
        self.is_initialized = True

    keys = property(lambda self: self.parts[0].keys, lambda self, t: None)
    values = property(lambda self: self.parts[0].values, lambda self, t: None)

    @property
    def length(self) -> int:
        return max(part.length for part in self.parts)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        for part, rows in zip(self.parts, self._rows):
            part.update(_take(key_states, rows), _take(value_states, rows))
        self.seen += key_states.shape[-2]
        self._notify_update(kwargs.get("kwargs"))
        return self.keys, self.values

    def attention_call_grouped(self, query: torch.Tensor, attend, inputs: PassInputs | None = None) -> torch.Tensor:
        """Each part's attention call on its rows of ``query`` (hooks, kernel, eviction; a part of head
        groups runs its own grouped call), outputs ``[B, q, Hq, D]`` in batch row order."""
        if inputs is not None:
            raise RuntimeError("polykv-search: a decoding row split takes no part in a reconstruction pass")
        outs = []
        for part, rows in zip(self.parts, self._rows):
            outs.append(part.attention_call_grouped(_take(query, rows), attend))
        self.calls += 1
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        return out if self._inverse is None else out.index_select(0, self._inverse)

    def write_back(self) -> None:
        """Give every row of the :class:`RowBatchLayer` parts its tokens, counters and pattern state again
        (a row's own layer needs nothing: it is the row's)."""
        for part in self.parts:
            part.write_back()


def _rows_index(rows: Sequence[int], device) -> slice | torch.Tensor:
    rows = list(rows)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.tensor(rows, device=device)


def _take(t: torch.Tensor, rows: slice | torch.Tensor) -> torch.Tensor:
    return t[rows] if isinstance(rows, slice) else t.index_select(0, rows)


def by_decoding_group(members: Sequence[EvictingLayer]) -> list[int]:
    """``members``' indices reordered so that the rows of each :func:`decoding_group` (the rows a
    :class:`RowBatchLayer` scores and evicts as one call) are consecutive: a group's view is then a
    slice of the store, not a gather of it. Groups keep their first row's order; rows that never evict
    in decoding go last."""
    rank: dict = {}
    keys = [decoding_group(member, i) for i, member in enumerate(members)]
    for key in keys:
        if key is not None:
            rank.setdefault(key, len(rank))
    return sorted(range(len(members)), key=lambda i: len(rank) if keys[i] is None else rank[keys[i]])


def row_parts(layer_idx: int, members: Sequence[RuntimeLayer], split: int | None, **kwargs) -> RuntimeLayer:
    """One layer of a decoding batch over ``members`` (the rows' own layers, in batch order): runs of
    consecutive :class:`EvictingLayer` rows share a :class:`RowBatchLayer` (cut in two by
    :func:`best_split` when that saves ``split`` padded slots; None: never), its rows in
    :func:`by_decoding_group` order; any other row's layer (head groups; a pooled allocation's heads of
    different lengths, ``EvictingLayer.ragged``) is a part of its own. A single row batch whose rows need
    no reordering is returned as is."""

    def pieces(run: list[int]) -> list[list[int]]:
        cut = None if split is None else best_split([members[i].length for i in run], split)
        return [run] if cut is None else [run[:cut], run[cut:]]

    # the rows a row batch may hold: plain layers, every KV head of a row as long as the others
    rows_of = {i: m for i, m in enumerate(members) if type(m) is EvictingLayer and not m.ragged}

    def grouped(piece: list[int]) -> list[int]:
        return [piece[i] for i in by_decoding_group([rows_of[i] for i in piece])]

    everyone = list(range(len(members)))
    if len(rows_of) == len(members):
        (only, *more) = pieces(everyone)
        if not more and grouped(only) == only:
            return RowBatchLayer(layer_idx, [rows_of[i] for i in everyone], **kwargs)
    sub = {**kwargs, "on_update": None}
    parts: list[tuple[RuntimeLayer, list[int]]] = []
    run: list[int] = []
    for i in [*everyone, None]:  # None closes the last run
        if i is not None and i in rows_of:
            run.append(i)
            continue
        for piece in pieces(run) if run else []:
            rows = grouped(piece)
            parts.append((RowBatchLayer(layer_idx, [rows_of[r] for r in rows], **sub), rows))
        run = []
        if i is not None:
            parts.append((members[i], [i]))
    return RowSplitLayer(layer_idx, parts, **kwargs)
