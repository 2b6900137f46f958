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
    """Rows ``[:cut]`` and ``[cut:]`` of a decoding batch as two :class:`RowBatchLayer` parts (see the
    module docstring). ``update`` hands each part its rows; the attention function calls
    :meth:`attention_call_grouped`, which runs each part's own ``attention_call`` on its rows of the
    queries and stacks the outputs in row order. ``keys``/``values`` are the first part's: only the
    runtime's attention function reads them, and it reads the parts."""

    def __init__(self, layer_idx: int, rows: Sequence[EvictingLayer], cut: int, **kwargs):
        super().__init__(layer_idx, **kwargs)
        rows = list(rows)
        if not 0 < cut < len(rows):
            raise ValueError(f"cut must split the {len(rows)} rows into two non-empty parts, got {cut!r}")
        sub = {**kwargs, "on_update": None}
        self._slices = [slice(0, cut), slice(cut, len(rows))]
        self.parts = [RowBatchLayer(layer_idx, rows[s], **sub) for s in self._slices]
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
        """Each part's ``attend(part, its rows of query)`` (hooks, kernel, eviction), outputs
        ``[B, q, Hq, D]`` stacked in row order."""
        out = torch.cat([attend(part, query[rows]) for part, rows in zip(self.parts, self._slices)])
        self.calls += 1
        return out

    def write_back(self) -> None:
        """Give every row its tokens, counters and pattern state again (see :meth:`RowBatchLayer.write_back`)."""
        for part in self.parts:
            part.write_back()
