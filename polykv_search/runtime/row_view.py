"""What a row group's pattern sees of a :class:`~polykv_search.runtime.row_batch.RowBatchLayer`.

Rows are stored compactly: row ``r``'s ``counts[r]`` tokens sit in slots ``0..counts[r]-1`` on every
head, the rest is padding (invalid, position -1). :class:`GroupView` shows one group's rows of that
store to their pattern through the :class:`~polykv_search.patterns.base.LayerView` protocol.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from polykv_search.runtime.view import ViewOps


def newest_only(layer, query_positions) -> bool:
    """True when the queries are exactly the newest token (no sliding window)."""
    return (
        isinstance(query_positions, range)
        and len(query_positions) == 1
        and query_positions.start == layer.seen - 1
        and layer.sliding_window is None
    )


class RowsMask:
    """``allowed`` for compactly stored rows: the newest query sees exactly the valid slots, one
    ``[R, 1, 1, n]`` mask for all heads."""

    def allowed(self, query_positions):
        if not self.all_valid and newest_only(self, query_positions):
            return self.valid[:, :1, None, :]
        return super().allowed(query_positions)


class GroupView(RowsMask, ViewOps):
    """A group's rows of the batch store, as its pattern reads them (no padding queries; ``values`` are
    sliced out only when a pattern reads them). :meth:`show` points it at the rows before each call."""

    all_valid: bool

    def __init__(
        self, layer_idx: int, *, num_kv_heads: int, groups: int, scaling: float, sliding_window, device, rotary=None
    ):
        self.layer_idx = layer_idx
        self.num_kv_heads = num_kv_heads
        self.groups = groups
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.device = device
        self.rotary = rotary
        # nothing until shown: no rows, no slots
        self.keys = torch.empty(0, num_kv_heads, 0, 0, device=device)
        self.positions = torch.empty(0, num_kv_heads, 0, dtype=torch.long, device=device)
        self.valid = torch.empty(0, num_kv_heads, 0, dtype=torch.bool, device=device)
        self._values: torch.Tensor | None = None
        self._take_values: Callable[[], torch.Tensor] | None = None
        self._counts: list[int] = []
        self._counts_tensor: torch.Tensor | None = None
        self.all_valid = True
        self.seen = self.calls = self.num_evictions = 0
        self.query_range = range(0)

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            assert self._take_values is not None, "a GroupView shows values only once it is shown rows"
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

    def show(
        self,
        keys: torch.Tensor,
        values: Callable[[], torch.Tensor],
        positions: torch.Tensor,
        valid: torch.Tensor,
        *,
        counts: list[int],
        all_valid: bool,
        seen: int,
        calls: int,
        num_evictions: int,
        query_range: range,
    ) -> None:
        """Show these rows (``[R_g, Hkv, n, ...]`` slices of the store; ``values()`` slices the values) and
        counters."""
        self._values, self._take_values = None, values
        self.keys, self.positions, self.valid, self.all_valid = keys, positions, valid, all_valid
        if counts != self._counts:
            self._counts, self._counts_tensor = counts, None
        self.seen, self.calls, self.num_evictions, self.query_range = seen, calls, num_evictions, query_range

    def query_valid(self, q_len: int) -> torch.Tensor | None:
        return None

    def attention_probs(self, query, query_positions, upto=None):
        probs = super().attention_probs(query, query_positions, upto)
        # A query that sees none of a row's keys (a SnapKV window query older than every kept token)
        # has NaN probabilities; alone, the row's window mask zeroes all of them, but here they would
        # also reach the padding slots (and SnapKV's pooling). Zero is what the row alone ends with.
        return probs if self.all_valid else probs.nan_to_num_(0.0)
