"""`ViewOps`: the read side of a layer's cache that patterns use (:class:`~polykv_search.patterns.base.LayerView`).

A mixin over the attributes every runtime layer and row view has: ``keys``/``positions``/``valid``
``[B, Hkv, n, ...]``, ``all_valid``, ``length``, ``seen`` (tokens seen), ``num_evictions``,
``query_range``, ``sliding_window``, ``num_kv_heads``, ``groups``, ``scaling``, ``device`` and ``rotary`` (the
model's :class:`~polykv_search.runtime.architectures.ModelRotary`, or None for a layer built without a
model). Masks are built from the absolute positions each slot holds, so they are exact whatever was
evicted.

:class:`GroupView` is what a row group's pattern sees of a
:class:`~polykv_search.runtime.row_batch.RowBatchLayer`: rows are stored compactly (row ``r``'s ``counts[r]``
tokens in slots ``0..counts[r]-1`` on every head, the rest padding, invalid at position -1), and the view
shows one group's rows of that store through the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch


class ViewOps:
    """Masks and exact attention statistics over the cached keys (see the module docstring)."""

    # What every layer and row view holds (declared for the type checker; each class sets them).
    layer_idx: int
    num_kv_heads: int
    groups: int
    scaling: float
    sliding_window: int | None
    device: torch.device
    rotary: Callable[[torch.Tensor | range], tuple[torch.Tensor, torch.Tensor]] | None
    seen: int
    num_evictions: int
    query_range: range
    keys: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor

    if TYPE_CHECKING:  # read-only here: some views compute them

        @property
        def values(self) -> torch.Tensor: ...

        @property
        def all_valid(self) -> bool: ...

        @property
        def length(self) -> int: ...

    def allowed(self, query_positions: torch.Tensor | range) -> torch.Tensor:
        """Bool mask broadcastable to ``[B, Hkv, q, n]``: which cached keys each query may attend to.

        Before any eviction and without padding, every row and head holds positions ``0..n-1``, so the
        mask is one ``[1, 1, q, n]`` causal (and sliding-window) pattern shared by all of them.
        """
        qpos = _as_tensor(query_positions, self.device)
        if self.num_evictions == 0 and self.all_valid:
            kpos = torch.arange(self.positions.shape[-1], device=self.device)[None, :]
            allowed = kpos <= qpos[:, None]
            if self.sliding_window is not None:
                allowed &= (qpos[:, None] - kpos) < self.sliding_window
            return allowed[None, None]
        kpos = self.positions[:, :, None, :]
        qpos = qpos[None, None, :, None]
        allowed = kpos <= qpos
        if self.sliding_window is not None:
            allowed &= (qpos - kpos) < self.sliding_window
        if self.all_valid:
            return allowed
        # A padding query sees only itself, so no row is empty and no NaN can leak into the cache.
        return (self.valid[:, :, None, :] & allowed) | (kpos == qpos)

    def row_counts(self) -> torch.Tensor | None:
        """None: rows are not known to be stored compactly (see :class:`GroupView`)."""
        return None

    def real_prefix(self) -> int | None:
        """Leading slots that hold real tokens in every row and head (None: not known, e.g. left padding)."""
        return self.length if self.all_valid else None

    def visibility(self, query_positions: torch.Tensor | range) -> torch.Tensor | None:
        """:meth:`allowed`, or None when every query sees every cached key: no padding, no sliding
        window, and the queries (a ``range``) are the newest token, which comes after every kept one."""
        if (
            isinstance(query_positions, range)
            and len(query_positions)
            and query_positions.start >= self.seen - 1
            and self.sliding_window is None
            and self.all_valid
        ):
            return None
        return self.allowed(query_positions)

    def query_valid(self, q_len: int) -> torch.Tensor | None:
        """Which of this call's ``q_len`` tokens are real ``[B, q]`` (the newest slots), or None when all are."""
        if self.all_valid:
            return None
        valid = self.valid[:, 0, self.length - q_len :]
        return None if bool(valid.all()) else valid

    def repeat_heads(self, t: torch.Tensor) -> torch.Tensor:
        """Expand a KV-head tensor ``[B, Hkv, ...]`` to query heads ``[B, Hq, ...]``."""
        return t if self.groups == 1 else t.repeat_interleave(self.groups, dim=1)

    def group_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Reduce a query-head tensor ``[B, Hq, n]`` to KV heads by summing over each GQA group."""
        b, hq = t.shape[:2]
        return t.reshape(b, hq // self.groups, self.groups, *t.shape[2:]).sum(dim=2)

    def group_mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.group_sum(t) / self.groups

    def attention_probs(
        self, query: torch.Tensor, query_positions: torch.Tensor | range, upto: int | None = None
    ) -> torch.Tensor:
        """Softmax attention ``[B, Hq, q, n]`` (fp32) of ``query`` (at ``query_positions``: a tensor or a
        ``range``) over the cached keys.

        ``upto``: only the first ``upto`` cached tokens (``[B, Hq, q, upto]``); exact when no query may
        see a later one (see :meth:`visible_prefix`), since masked keys get probability 0 anyway.
        """
        b, hq, q, d = query.shape
        h, g = self.num_kv_heads, self.groups
        keys = self.keys if upto is None else self.keys[..., :upto, :]
        n = keys.shape[-2]
        # Group the query heads of each KV head instead of copying K per query head.
        # the scale goes on the (small) queries, not on the [q, n] logits: one pass less over them
        scaled = query.float().reshape(b, h, g * q, d) * self.scaling
        logits = torch.matmul(scaled, keys.float().transpose(-1, -2)).view(b, h, g, q, n)
        real = self.real_prefix() if isinstance(query_positions, range) and self.sliding_window is None else None
        if real is not None:
            # Kept positions are distinct, ascending and < seen, so in a row of ``real`` leading real
            # tokens only the slots from ``real - (seen - 1 - start)`` on can hold a key after the first
            # query (or padding): mask just those columns.
            assert isinstance(query_positions, range)
            first = real - (self.seen - 1 - query_positions.start)
            if q and first < n:
                first = max(first, 0)
                kpos = self.positions[:, :, None, first:n]
                qpos = torch.arange(query_positions.start, query_positions.stop, device=self.device)
                hidden = kpos > qpos[:, None]
                if not self.all_valid:
                    hidden |= ~self.valid[:, :, None, first:n]
                logits[..., first:].masked_fill_(hidden[:, :, None], float("-inf"))
        else:
            mask = self.visibility(query_positions)
            if mask is not None:
                logits.masked_fill_(~mask[..., :n][:, :, None], float("-inf"))
        return logits.softmax(dim=-1).view(b, hq, q, n)

    def rotary_cos_sin(self, positions: torch.Tensor | range) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's RoPE ``(cos, sin)`` ``[len(positions), D]`` (fp32) at sequence ``positions``."""
        if self.rotary is None:
            raise RuntimeError(
                f"layer {self.layer_idx} has no rotary embedding: it was built without a model (pass "
                "rotary=, e.g. from runtime.layer_kwargs), and this pattern needs RoPE"
            )
        return self.rotary(positions)

    def visible_prefix(self, max_query_position: int) -> int:
        """How many leading cached tokens a query at ``max_query_position`` (or before) may see: the cache
        keeps tokens in position order, so every visible one lies in this prefix."""
        if self.num_evictions == 0:
            return min(self.positions.shape[-1], max_query_position + 1)
        if max_query_position >= self.seen - 1:  # every kept token is at or before the newest one
            return self.length
        return int((self.positions <= max_query_position).sum(-1).max())


def _as_tensor(positions: torch.Tensor | range, device) -> torch.Tensor:
    if isinstance(positions, range):
        return torch.arange(positions.start, positions.stop, device=device)
    return positions.to(device)


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
