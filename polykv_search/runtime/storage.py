"""`TokenStore`: preallocated per-layer token storage, so that a decoding step writes in place.

A layer's cache exposes ``[B, Hkv, n, ...]`` views of buffers with ``capacity >= n`` slots. Appending
writes the new tokens into free slots; evicting gathers the kept tokens straight into a fresh store
(one copy; the old, larger buffers are released). Slots past ``n`` hold stale data that no view shows.

A store only ever grows within its buffers, so views handed out earlier (e.g. to forked layers that
share the prompt) never see a write: appends land past every earlier view's end.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def gathered(self, keep: torch.Tensor, capacity: int) -> TokenStore:
        """A new store of ``capacity`` slots holding, first, the tokens ``keep`` ``[B, Hkv, b]`` of this
        one (one ``index_select`` per buffer: the padding slots copy token 0 and are never shown)."""
        b, h, cap, d = self.keys.shape
        padded = F.pad(keep, (0, capacity - keep.shape[-1]))
        rows = (padded + torch.arange(b * h, device=keep.device).view(b, h, 1) * cap).reshape(-1)
        keys = self.keys.reshape(b * h * cap, d).index_select(0, rows).view(b, h, capacity, d)
        values = self.values.reshape(b * h * cap, -1).index_select(0, rows).view(b, h, capacity, -1)
        return TokenStore(keys, values, self.positions.gather(-1, padded), self.valid.gather(-1, padded))

    def views(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first ``n`` slots of every buffer."""
        return self.keys[:, :, :n], self.values[:, :, :n], self.positions[:, :, :n], self.valid[:, :, :n]
