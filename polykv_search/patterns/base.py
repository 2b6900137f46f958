"""The pattern protocol: the three hook points and the shared keep-the-best-``b`` selection.

A pattern is a small frozen dataclass holding its parameters; everything that changes while a
sequence is processed lives in the layer's :class:`~polykv_search.runtime.layer.EvictingLayer`
(``layer.state(key)`` gives a pattern its own dict of tensors). Tensors whose last axis is the token
axis and that are stored under ``state["token"]`` are gathered with the cache on every eviction.

Hook points, called by the runtime in this order for every attention call of a layer:

``pre_kernel(layer, state, query)``
    Post-RoPE queries of this call are visible; this call's keys/values are already appended.
``post_kernel(layer, state, query)``
    After the attention kernel: compute the attention statistics the pattern needs.
``cache_update(layer, state, budget) -> keep``
    Only when the layer must shrink: return the indices ``[batch, kv_heads, budget]`` to keep.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:  # pragma: no cover
    from polykv_search.runtime.layer import EvictingLayer

NEG_INF = float("-inf")
POS_INF = float("inf")


@dataclass(frozen=True)
class Pattern:
    """Base class of every eviction pattern (see the module docstring for the hook points)."""

    name: ClassVar[str] = ""
    #: True when the pattern never evicts (``full``).
    keeps_all: ClassVar[bool] = False
    #: True when scoring rows as one padded batch gives each row's own scores (false for seeded draws).
    batch_exact: ClassVar[bool] = True

    # -------------------------------------------------------------- hook points
    def pre_kernel(self, layer: EvictingLayer, state: dict, query: torch.Tensor) -> None:
        """Called before the kernel with this call's post-RoPE queries ``[B, Hq, q, D]``."""

    def post_kernel(self, layer: EvictingLayer, state: dict, query: torch.Tensor) -> None:
        """Called after the kernel; accumulate attention statistics here."""

    def cache_update(self, layer: EvictingLayer, state: dict, budget: int) -> torch.Tensor:
        """Indices ``[B, Hkv, budget]`` (ascending) of the cached tokens to keep."""
        score = self.score(layer, state)
        protected = self.protected(layer, budget)
        return select_keep(score, None if layer.all_valid else layer.valid, protected, budget)

    # ---------------------------------------------------------- building blocks
    def score(self, layer: EvictingLayer, state: dict) -> torch.Tensor:
        """Importance ``[B, Hkv, n]`` of every cached token (higher is kept first)."""
        raise NotImplementedError

    def protected(self, layer: EvictingLayer, budget: int) -> torch.Tensor | None:
        """Bool ``[B, Hkv, n]``: tokens kept regardless of score (sinks, recent window); None: none."""
        return None

    # ------------------------------------------------------------------ utility
    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def valid_rank(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank of each valid token among the valid tokens of its row (0 = oldest), and the row count.

    The cache keeps tokens in position order, so a cumulative sum along the token axis is the rank.
    """
    v = valid.long()
    rank = v.cumsum(-1) - 1
    return rank, v.sum(-1, keepdim=True)


def sinks_and_recent(valid: torch.Tensor, budget: int, n_sink: int, n_recent: int) -> torch.Tensor:
    """Protect the oldest ``n_sink`` and newest ``n_recent`` valid tokens, capped at ``budget``."""
    n_sink = min(n_sink, budget)
    n_recent = min(n_recent, budget - n_sink)
    rank, count = valid_rank(valid)
    sink = rank < n_sink
    recent = (count - 1 - rank) < n_recent
    return valid & (sink | recent)


def protected_ends(layer: EvictingLayer, budget: int, n_sink: int, n_recent: int) -> torch.Tensor:
    """:func:`sinks_and_recent` of the layer's cache; without padding the ranks are the slots."""
    if not layer.all_valid:
        return sinks_and_recent(layer.valid, budget, n_sink, n_recent)
    n_sink = min(n_sink, budget)
    n_recent = min(n_recent, budget - n_sink)
    n = layer.length
    slot = torch.arange(n, device=layer.valid.device)
    return ((slot < n_sink) | (slot >= n - n_recent)).expand(layer.valid.shape)


def select_keep(
    score: torch.Tensor, valid: torch.Tensor | None, protected: torch.Tensor | None, budget: int
) -> torch.Tensor:
    """Keep ``budget`` tokens per row: protected first, then highest score, padding last.

    ``valid=None``: no padding; ``protected=None``: nothing protected. Ties are broken towards the
    older token (a stable descending sort), which the reference implementations in the tests
    reproduce exactly. The result is sorted by token index.
    """
    key = score.float()
    if protected is not None:
        key = key.masked_fill(protected, POS_INF)
    if valid is not None:
        key = key.masked_fill(~valid, NEG_INF)
    n = key.shape[-1]
    if n == budget + 1:
        # one token out (a decoding step): the sort's last, i.e. the newest of the lowest keys
        drop = (n - 1) - key.flip(-1).argmin(dim=-1, keepdim=True)
        slot = torch.arange(budget, device=key.device)
        return slot + (slot >= drop)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    return order[..., :budget].sort(dim=-1).values
