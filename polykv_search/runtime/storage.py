"""`TokenStore`: the one storage of cached tokens, for every layer and layout of the runtime.

A store holds buffers ``keys``/``values`` ``[B, Hkv, capacity, D]`` and ``positions``/``valid``
``[B, Hkv, capacity]``; a layer shows ``[B, Hkv, n, ...]`` views of its first ``n`` slots. Rows may hold
different numbers of tokens (a row batch: row ``r``'s tokens in slots ``0..count_r - 1``, the rest padding,
invalid at position -1), and so may the KV heads of a row (a pooled allocation: the shorter heads' extra
slots invalid). Its operations, each written once:

- :meth:`append`: new tokens into free slots, at one slot for every row or at each row's own;
- :meth:`gathered`: an eviction into a fresh store (one copy; the old, larger buffers are released);
- :meth:`compact`: an eviction of some rows in place (the kept slots first, then padding);
- :meth:`write`: a row's slots from another layer's tensors;
- :meth:`grown`: the same tokens in a larger store.

:class:`StoreViews` is a layer's side of it: the cached tensors it shows, views of its store's first slots, and for a
store of rows (a row batch's) each row's count (:meth:`StoreViews.hold_rows`, :meth:`StoreViews.compact_rows`).

A store only ever grows within its buffers, so views handed out earlier (e.g. to forked layers that share
the prompt) never see an append: appends land past every earlier view's end. Slots no view shows hold
stale data (:meth:`holding`) or finite padding (:meth:`padded`, for stores whose padding is attended over,
masked: ``0 * NaN`` would be NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def capacity_for(need: int, slack: int) -> int:
    """Slots to allocate for ``need`` tokens: ``slack`` free slots plus 1/16 for growing caches."""
    return need + slack + need // 16


@dataclass
class TokenStore:
    """Buffers ``keys``/``values`` ``[B, Hkv, capacity, D]``, ``positions``/``valid`` ``[B, Hkv, capacity]``."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor

    @property
    def capacity(self) -> int:
        return self.keys.shape[-2]

    # ----------------------------------------------------------------- making
    @classmethod
    def holding(cls, keys, values, positions, valid, capacity: int) -> TokenStore:
        """A store of ``capacity`` slots whose first ``n`` hold the given ``[B, Hkv, n, ...]`` tensors."""
        b, h, n, d = keys.shape
        store = cls(
            keys.new_empty(b, h, capacity, d),
            values.new_empty(b, h, capacity, values.shape[-1]),
            positions.new_empty(b, h, capacity),
            valid.new_empty(b, h, capacity),
        )
        store.keys[:, :, :n] = keys
        store.values[:, :, :n] = values
        store.positions[:, :, :n] = positions
        store.valid[:, :, :n] = valid
        return store

    @classmethod
    def padded(cls, rows: int, capacity: int, keys: torch.Tensor, values: torch.Tensor) -> TokenStore:
        """An all-padding store of ``rows`` rows like ``keys``/``values`` ``[., Hkv, ., D]`` (heads, head sizes,
        dtypes, device): zeros, position -1, invalid."""
        h, dev = keys.shape[1], keys.device
        return cls(
            torch.zeros(rows, h, capacity, keys.shape[-1], dtype=keys.dtype, device=dev),
            torch.zeros(rows, h, capacity, values.shape[-1], dtype=values.dtype, device=dev),
            torch.full((rows, h, capacity), -1, dtype=torch.long, device=dev),
            torch.zeros(rows, h, capacity, dtype=torch.bool, device=dev),
        )

    def grown(self, n: int, capacity: int) -> TokenStore:
        """A padded store of ``capacity`` slots holding this one's first ``n``."""
        new = TokenStore.padded(self.keys.shape[0], capacity, self.keys, self.values)
        for a, b in zip((new.keys, new.values, new.positions, new.valid), self.views(n)):
            a[:, :, :n] = b
        return new

    # ---------------------------------------------------------------- writing
    def append(self, at: int | Sequence[int], keys: torch.Tensor, values: torch.Tensor, first: int) -> None:
        """Write ``q`` new tokens ``[B, Hkv, q, D]`` at sequence positions ``first..first+q-1``, valid, into the
        slots from ``at`` (every row) or from ``at[r]`` (row ``r``)."""
        q, dev = keys.shape[-2], keys.device
        if isinstance(at, int):
            self.keys[:, :, at : at + q] = keys
            self.values[:, :, at : at + q] = values
            if q == 1:
                self.positions[:, :, at].fill_(first)
            else:
                self.positions[:, :, at : at + q] = torch.arange(first, first + q, device=dev)
            self.valid[:, :, at : at + q] = True
            return
        slot = torch.tensor(list(at), device=dev)[:, None] + torch.arange(q, device=dev)
        rows = torch.arange(len(at), device=dev)[:, None]
        self.keys[rows, :, slot] = keys.transpose(1, 2)
        self.values[rows, :, slot] = values.transpose(1, 2)
        self.positions[rows, :, slot] = torch.arange(first, first + q, device=dev)[None, :, None]
        self.valid[rows, :, slot] = True

    def write(self, row: int, start: int, keys, values, positions, valid) -> None:
        """Slots ``start..`` of row ``row`` from one row's ``[Hkv, m, ...]`` tensors."""
        stop = start + keys.shape[-2]
        self.keys[row, :, start:stop] = keys
        self.values[row, :, start:stop] = values
        self.positions[row, :, start:stop] = positions
        self.valid[row, :, start:stop] = valid

    # --------------------------------------------------------------- evicting
    def gathered(self, keep: torch.Tensor, capacity: int) -> TokenStore:
        """A new store of ``capacity`` slots holding, first, the tokens ``keep`` ``[B, Hkv, b]`` of this
        one (one ``index_select`` per buffer: the padding slots copy token 0 and are never shown)."""
        b, h, cap, d = self.keys.shape
        padded = F.pad(keep, (0, capacity - keep.shape[-1]))
        rows = (padded + torch.arange(b * h, device=keep.device).view(b, h, 1) * cap).reshape(-1)
        keys = self.keys.reshape(b * h * cap, d).index_select(0, rows).view(b, h, capacity, d)
        values = self.values.reshape(b * h * cap, -1).index_select(0, rows).view(b, h, capacity, -1)
        return TokenStore(keys, values, self.positions.gather(-1, padded), self.valid.gather(-1, padded))

    def compact(self, rows: torch.Tensor, keep: torch.Tensor, kept: torch.Tensor) -> None:
        """Rewrite, in place, slots ``0..m-1`` of the rows ``rows`` ``[E]``: slot ``j`` gets slot ``keep[e, h, j]``
        (``keep`` ``[E, Hkv, m]``), or padding where ``kept[e, 0, j]`` is False (``kept`` ``[E, 1, m]``)."""
        r, h, cap = self.keys.shape[:3]
        base = (rows[:, None, None] * h + torch.arange(h, device=rows.device)[None, :, None]) * cap
        src = (base + keep).reshape(-1)
        dst = (base + torch.arange(keep.shape[-1], device=rows.device)).reshape(-1)
        for buf in (self.keys, self.values):
            flat = buf.view(r * h * cap, buf.shape[-1])
            flat.index_copy_(0, dst, flat.index_select(0, src))
        flat = self.positions.view(-1)
        flat.index_copy_(0, dst, flat.index_select(0, src).view_as(keep).masked_fill_(~kept, -1).reshape(-1))
        self.valid.view(-1).index_copy_(0, dst, kept.expand_as(keep).reshape(-1))

    # ---------------------------------------------------------------- reading
    def views(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first ``n`` slots of every buffer."""
        return self.keys[:, :, :n], self.values[:, :, :n], self.positions[:, :, :n], self.valid[:, :, :n]


class StoreViews:
    """A layer's cached tensors ``keys``/``values`` ``[B, Hkv, n, D]`` and ``positions``/``valid`` ``[B, Hkv, n]`` (None
    until the first update): views of the first ``n`` slots of its own :class:`TokenStore`, or tensors assigned from
    outside (the next append then moves them into a store of the layer's own)."""

    _keys: Any
    _values: Any
    _positions: Any
    _valid: Any
    _store: TokenStore | None
    _all_valid: bool | None
    decode_interval: int
    #: Tokens per row of a store of rows (a row batch: row ``r``'s first in slots ``0..counts[r]-1``), else None.
    counts: list[int] | None

    keys = property(lambda self: self._keys, lambda self, t: self._assign("_keys", t))
    values = property(lambda self: self._values, lambda self, t: self._assign("_values", t))
    positions = property(lambda self: self._positions, lambda self, t: self._assign("_positions", t))
    valid = property(lambda self: self._valid, lambda self, t: self._assign("_valid", t))

    def _assign(self, name: str, tensor: torch.Tensor | None) -> None:
        setattr(self, name, tensor)
        self._store = None
        if name == "_valid":
            self._all_valid = None

    def _expose(self, store: TokenStore, n: int) -> None:
        self._keys, self._values, self._positions, self._valid = store.views(n)
        self._store = store

    def hold_rows(self, store: TokenStore, counts: list[int]) -> None:
        """Show the padded ``store`` of rows that hold ``counts[r]`` tokens each, first in their slots."""
        self.counts = counts
        self._expose(store, max(counts))
        self._all_valid = min(counts) == max(counts)

    def compact_rows(self, rows: list[int], keep: torch.Tensor, kept: torch.Tensor, budgets: list[int]) -> None:
        """Evict rows ``rows`` of a store of rows in place (:meth:`TokenStore.compact`); row ``rows[e]`` then holds
        ``budgets[e]`` tokens."""
        assert self._store is not None and self.counts is not None
        self._store.compact(torch.tensor(rows, device=keep.device), keep, kept)
        counts = list(self.counts)
        for r, b in zip(rows, budgets):
            counts[r] = b
        self.hold_rows(self._store, counts)

    @property
    def all_valid(self) -> bool:
        """True when every cached token of every row and head is a real token (no padding)."""
        if self._all_valid is None:
            self._all_valid = self._valid is None or bool(self._valid.all())
        return bool(self._all_valid)

    @property
    def length(self) -> int:
        """Tokens physically held per (batch row, KV head)."""
        return 0 if self._keys is None else self._keys.shape[-2]

    def _slack(self) -> int:
        """Free slots a store keeps past its tokens: a decoding interval's worth, plus some."""
        return self.decode_interval + 16

    def _thaw_tensors(self) -> None:
        """Copies of the cached tensors made inside ``torch.inference_mode``; the next append moves them into a new
        store."""
        for name in ("_keys", "_values", "_positions", "_valid"):
            tensor = getattr(self, name)
            if tensor is not None and tensor.is_inference():
                setattr(self, name, tensor.clone())
        self._store = None

    def kv_bytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()
