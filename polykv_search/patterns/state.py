"""`PatternState`: what a pattern remembers between hook calls, typed by how it follows the cache.

Three kinds, each moved by the runtime in one place (this module), never by the patterns:

``token``
    Tensors ``[B, Hkv, n]`` aligned with the cached tokens (e.g. H2O's accumulated attention).
    Gathered with the cache on every eviction, padded or cut with it when rows are stacked. Padding
    slots (``layer.valid`` False) must stay zero: a row-batched layer hands them to the row's next tokens.
``row``
    Tensors ``[B, ...]`` with one entry per batch row (e.g. SnapKV's window of recent queries).
    Reordered, selected and stacked with the batch rows.
``shared``
    Anything that is the same for every row (e.g. the query positions of that window, a ``range``).
    Rows stacked together must agree on it.
``memo``
    What a pattern derived from the cache and can always recompute (e.g. SnapKV's window logits). The
    runtime never moves it: an eviction (``gather``, ``gather_rows``) and ``fit`` leave it as it is, so the
    pattern must check it against the layer (positions) before using it; every batch-axis move (``map_rows``,
    ``stack``, ``take_row``, ``heads``) and ``thaw`` drop it. Copies copy it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


def fit_tokens(t: torch.Tensor, n: int) -> torch.Tensor:
    """A token-axis tensor cut or zero-padded to ``n`` slots (cut slots are padding, so zero)."""
    if t.shape[-1] == n:
        return t
    if t.shape[-1] > n:
        return t[..., :n].contiguous()
    return torch.nn.functional.pad(t, (0, n - t.shape[-1]))


@dataclass
class PatternState:
    """A pattern's state in one layer (see the module docstring for the three kinds)."""

    token: dict[str, torch.Tensor] = field(default_factory=dict)
    row: dict[str, torch.Tensor] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    memo: dict[str, Any] = field(default_factory=dict)

    def gather(self, keep: torch.Tensor) -> None:
        """Keep the token slots ``keep`` ``[B, Hkv, b]`` of every token tensor (an eviction)."""
        for name, tensor in self.token.items():
            self.token[name] = tensor.gather(-1, keep)

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply a batch-axis map (reorder, select, repeat) to every token and row tensor (the memo is dropped)."""
        self.memo.clear()
        for kind in (self.token, self.row):
            for name, tensor in kind.items():
                kind[name] = fn(tensor)

    def fit(self, n: int) -> None:
        """Cut or zero-pad every token tensor to ``n`` slots (a right-padded batch's new width)."""
        for name, tensor in self.token.items():
            self.token[name] = fit_tokens(tensor, n)

    def copy(self) -> PatternState:
        """An independent copy (tensors cloned)."""
        return copy.deepcopy(self)

    def thaw(self) -> None:
        """Replace every tensor made inside ``torch.inference_mode`` by a normal copy, so that ops outside it
        may update the state in place (see :meth:`~polykv_search.runtime.runtime.PolyKVCache.prepare_forward`);
        the memo is dropped."""
        self.memo.clear()
        for kind in (self.token, self.row, self.shared):
            for name, value in kind.items():
                if isinstance(value, torch.Tensor) and value.is_inference():
                    kind[name] = value.clone()

    def heads(self, kv_heads: list[int]) -> PatternState:
        """A copy holding only the KV heads ``kv_heads`` of every token tensor ``[B, Hkv, n]`` (a head
        group's share); row and shared entries are copied whole."""
        out = self.copy()
        out.token = {name: t[:, kv_heads].clone() for name, t in self.token.items()}
        out.memo.clear()
        return out

    def replace_with(self, other: PatternState) -> None:
        """Become a copy of ``other`` (in place, so holders of this object see it)."""
        fresh = other.copy()
        self.token, self.row, self.shared, self.memo = fresh.token, fresh.row, fresh.shared, fresh.memo

    @classmethod
    def stack(cls, states: list[PatternState], counts: list[int]) -> PatternState:
        """One state for rows stacked as a right-padded batch: row ``j`` of ``states[j]`` (a one-row
        state holding ``counts[j]`` tokens) becomes row ``j``; token tensors are zero-padded to the
        longest row."""
        first = states[0]
        for s in states[1:]:
            if s.token.keys() != first.token.keys() or s.row.keys() != first.row.keys():
                raise ValueError("rows of a group have different pattern states")
            if s.shared.keys() != first.shared.keys():
                raise ValueError("rows of a group have different pattern states")
        n = max(counts)
        out = cls()
        for name in first.token:
            out.token[name] = torch.cat([fit_tokens(s.token[name], n) for s in states])
        for name in first.row:
            if any(s.row[name].dim() < 1 or s.row[name].shape[0] != 1 for s in states):
                raise ValueError(f"pattern state {name!r} is not a per-row [1, ...] tensor")
            out.row[name] = torch.cat([s.row[name] for s in states])
        for name, value in first.shared.items():
            if any(s.shared[name] != value for s in states[1:]):
                raise ValueError(f"rows of a group disagree on pattern state {name!r}")
            out.shared[name] = value
        return out

    def take_row(self, j: int, count: int) -> PatternState:
        """Row ``j`` of a stacked state, its token tensors cut to its ``count`` tokens (the inverse
        of :meth:`stack`)."""
        return PatternState(
            token={name: t[j : j + 1, :, :count] for name, t in self.token.items()},
            row={name: t[j : j + 1] for name, t in self.row.items()},
            shared=dict(self.shared),
        )

    def gather_rows(self, rows: list[int] | None, keep: torch.Tensor, kept: torch.Tensor, end: int) -> None:
        """An eviction of some rows of a right-padded batch: rows ``rows`` (None: every row) keep the
        slots ``keep`` ``[E, Hkv, m]`` of their first ``end`` slots, in order (``kept`` ``[E, 1, m]``
        False: padding, zeroed); the other rows, possibly longer, keep theirs."""
        for name, tensor in self.token.items():
            if rows is None:
                fresh = fit_tokens(tensor, end).gather(-1, keep).masked_fill_(~kept, 0)
            else:
                sel = torch.tensor(rows, device=tensor.device)
                fresh = fit_tokens(tensor, max(end, tensor.shape[-1]))
                part = fit_tokens(fresh.index_select(0, sel), end).gather(-1, keep).masked_fill_(~kept, 0)
                fresh[sel] = fit_tokens(part, fresh.shape[-1])
            self.token[name] = fresh
