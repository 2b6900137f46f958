"""`RowSplitLayer`: one decoding batch whose rows sit in two row batches, each padded to its own longest row.

A FullKV row holding a 2,048-token prompt beside rows that hold 64 tokens: in one padded store every
row would attend over 2,048 slots; in a batch of its own the long row pays a pass over the model's
weights of its own. Here the rows share the model's forward (one weights pass for all of them) and
each *part* (consecutive rows) is its own :class:`~polykv_search.runtime.row_batch.RowBatchLayer`:
its own store, pattern hooks, evictions and attention kernel over its own longest row. A part keeps
exactly what its rows keep alone, so the split changes no result, only the padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layer import EvictingLayer
from polykv_search.runtime.row_batch import RowBatchLayer

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
    """A decoding batch's rows as consecutive *parts*, each a layer of its own (see the module docstring):
    a :class:`RowBatchLayer` of some rows, or one row's own layer (e.g. a
    :class:`~polykv_search.runtime.head_groups.HeadGroupLayer`, whose head groups keep their own stores).
    ``update`` hands each part its rows; the attention function calls :meth:`attention_call_grouped`,
    which runs each part's own attention call on its rows of the queries and stacks the outputs in row
    order. ``keys``/``values`` are the first part's: only the runtime's attention function reads them,
    and it reads the parts. Parts must be built detached (``on_update=None``): this layer notifies."""

    def __init__(self, layer_idx: int, parts: Sequence[tuple[RuntimeLayer, int]], **kwargs):
        super().__init__(layer_idx, **kwargs)
        if not parts or any(rows < 1 for _, rows in parts):
            raise ValueError(f"a row split needs parts of at least one row each, got {[r for _, r in parts]}")
        self.parts = [part for part, _ in parts]
        starts = [0]
        for _, rows in parts:
            starts.append(starts[-1] + rows)
        self._slices = [slice(a, b) for a, b in zip(starts, starts[1:])]
        first = self.parts[0]
        self.device, self.seen, self.calls = first.device, first.seen, first.calls
        self.is_initialized = True

    keys = property(lambda self: self.parts[0].keys, lambda self, t: None)
    values = property(lambda self: self.parts[0].values, lambda self, t: None)

    @property
    def length(self) -> int:
        return max(part.length for part in self.parts)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        for part, rows in zip(self.parts, self._slices):
            part.update(key_states[rows], value_states[rows])
        self.seen += key_states.shape[-2]
        self._notify_update()
        return self.keys, self.values

    def attention_call_grouped(self, query: torch.Tensor, attend) -> torch.Tensor:
        """Each part's attention call on its rows of ``query`` (hooks, kernel, eviction; a part of head
        groups runs its own grouped call), outputs ``[B, q, Hq, D]`` stacked in row order."""
        outs = []
        for part, rows in zip(self.parts, self._slices):
            grouped = getattr(part, "attention_call_grouped", None)
            outs.append(grouped(query[rows], attend) if grouped is not None else attend(part, query[rows]))
        self.calls += 1
        return torch.cat(outs)

    def write_back(self) -> None:
        """Give every row of the :class:`RowBatchLayer` parts its tokens, counters and pattern state again
        (a row's own layer needs nothing: it is the row's)."""
        for part in self.parts:
            if isinstance(part, RowBatchLayer):
                part.write_back()


def row_parts(layer_idx: int, members: Sequence[RuntimeLayer], split: int | None, **kwargs) -> RuntimeLayer:
    """One layer of a decoding batch over ``members`` (the rows' own layers, in batch order): runs of
    consecutive :class:`EvictingLayer` rows share a :class:`RowBatchLayer` (cut in two by
    :func:`best_split` when that saves ``split`` padded slots; None: never), any other row's layer (head
    groups) is a part of its own. A single row batch is returned as is."""

    def pieces(run: list[RuntimeLayer]) -> list[list[RuntimeLayer]]:
        cut = None if split is None else best_split([m.length for m in run], split)
        return [run] if cut is None else [run[:cut], run[cut:]]

    plain = all(type(m) is EvictingLayer for m in members)
    if plain and len(pieces(list(members))) == 1:
        return RowBatchLayer(layer_idx, members, **kwargs)
    sub = {**kwargs, "on_update": None}
    parts: list[tuple[RuntimeLayer, int]] = []
    run: list[RuntimeLayer] = []
    for member in [*members, None]:  # None closes the last run
        if type(member) is EvictingLayer:
            run.append(member)
            continue
        parts.extend((RowBatchLayer(layer_idx, piece, **sub), len(piece)) for piece in (pieces(run) if run else []))
        run = []
        if member is not None:
            parts.append((member, 1))
    return RowSplitLayer(layer_idx, parts, **kwargs)
