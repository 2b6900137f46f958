"""Token selection shared by every pattern: protected ends and keep-the-best-``b``, per layer and per row.

``select_keep`` keeps one budget for every row of a layer; ``keep_per_row`` gives each row of a
right-padded batch its own budget (the row-batched decoding of many entries), with the same
tie-breaking, so a row keeps the same tokens either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from polykv_search.patterns.base import LayerView

NEG_INF = float("-inf")
POS_INF = float("inf")


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


def protected_ends(layer: LayerView, budget: int, n_sink: int, n_recent: int) -> torch.Tensor:
    """:func:`sinks_and_recent` of the layer's cache; without padding the ranks are the slots, and so
    they are in a view of compact rows (``row_counts``: row ``e``'s tokens in slots ``0..count-1``)."""
    n_sink = min(n_sink, budget)
    n_recent = min(n_recent, budget - n_sink)
    n = layer.length
    slot = torch.arange(n, device=layer.valid.device)
    if layer.all_valid:
        return ((slot < n_sink) | (slot >= n - n_recent)).expand(layer.valid.shape)
    counts = layer.row_counts()
    if counts is None:
        return sinks_and_recent(layer.valid, budget, n_sink, n_recent)
    count = counts[:, None, None]  # [E, 1, 1]
    return (((slot < n_sink) | (slot >= count - n_recent)) & (slot < count)).expand(layer.valid.shape)


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


def keep_per_row(
    key: torch.Tensor, budgets: Sequence[int], counts: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row ``e`` the ``budgets[e]`` highest-key slots, ascending (ties: older first, as
    :func:`~polykv_search.patterns.base.select_keep`), padded to the largest budget.

    ``counts``: the rows' real tokens (slots ``0..counts[e]-1``; ``key`` is -inf past them), which
    allows a sort-free path when every row drops one token (a decoding step).

    Returns ``keep`` ``[E, H, m]`` (slot indices; padding entries repeat slot 0) and ``kept``
    ``[E, 1, m]`` (True for the real entries)."""
    m, low = max(budgets), min(budgets)
    dev = key.device
    if counts is not None and all(c == b + 1 for c, b in zip(counts, budgets)):
        return _one_out(key, budgets, counts)
    if low == m:  # one budget: the single-budget selection itself (``key`` carries every mask already)
        return select_keep(key, None, None, m), torch.ones(key.shape[0], 1, m, dtype=torch.bool, device=dev)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :m]
    b = torch.tensor(list(budgets), device=dev)
    kept = torch.arange(m, device=dev)[None, None, :] < b[:, None, None]
    keep = order.masked_fill(~kept, key.shape[-1]).sort(dim=-1).values  # the padding entries sort last
    return keep.masked_fill(~kept, 0), kept


def _one_out(key: torch.Tensor, budgets: Sequence[int], counts: Sequence[int]):
    """:func:`keep_per_row` when row ``e`` holds ``budgets[e] + 1`` real tokens: it drops the newest
    of its lowest keys (what the stable descending sort leaves out)."""
    dev = key.device
    n, m = key.shape[-1], max(budgets)
    slot = torch.arange(n, device=dev)
    real = slot < torch.tensor(list(counts), device=dev)[:, None, None]  # [E, 1, n]
    lowest = key.masked_fill(~real, POS_INF).amin(dim=-1, keepdim=True)
    drop = torch.where((key == lowest) & real, slot, -1).amax(dim=-1, keepdim=True)  # [E, H, 1]
    s = torch.arange(m, device=dev)
    kept = s[None, None, :] < torch.tensor(list(budgets), device=dev)[:, None, None]
    return (s + (s >= drop)).masked_fill_(~kept, 0), kept


def keep_per_head(key: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and KV head the ``counts[b, h]`` highest-key slots, ascending (ties: older first, as
    :func:`select_keep`), padded to the largest count.

    Returns ``keep`` ``[B, H, m]`` (slot indices; padding entries repeat slot 0) and ``kept`` ``[B, H, m]``
    (True for the real entries), ``m = counts.max()``."""
    m = int(counts.max()) if counts.numel() else 0
    if counts.numel() and int(counts.min()) == m:  # one count for all: the single-budget selection itself
        return select_keep(key, None, None, m), torch.ones(key.shape[:-1] + (m,), dtype=torch.bool, device=key.device)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :m]
    kept = torch.arange(m, device=key.device) < counts[..., None]
    keep = order.masked_fill(~kept, key.shape[-1]).sort(dim=-1).values  # the padding entries sort last
    return keep.masked_fill(~kept, 0), kept


def protect_top_share(
    key: torch.Tensor, score: torch.Tensor, candidate: torch.Tensor, share: float, budgets: Sequence[int]
) -> torch.Tensor:
    """``key`` ``[E, H, n]`` with each row and head's best candidates protected (+inf) as well: the ``candidate``
    slots (bool, broadcastable) that ``key`` neither protects nor marks as padding, ranked by ``score`` (ties:
    older first, as :func:`select_keep`); row ``e`` protects ``min(floor(share * budgets[e]), budgets[e] - S)``
    of them, ``S`` the tokens ``key`` already protects there, so that everything protected fits the budget.
    ``budgets``: one entry for every row, or one per row (the evidence share of ``kvzip`` and ``evidence``)."""
    cand = candidate & torch.isfinite(key)
    per_row = budgets if len(set(budgets)) > 1 else budgets[:1]
    shape = (-1, 1, 1) if len(per_row) > 1 else (1,)
    b = torch.tensor(list(per_row), device=key.device).view(shape)
    wanted = torch.tensor([math.floor(share * x) for x in per_row], device=key.device).view(shape)
    limit = torch.minimum(wanted, b - (key == POS_INF).sum(-1, keepdim=True)).clamp_(min=0)  # [E, H, 1]
    ranked = score.float().masked_fill(~cand, NEG_INF)
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(key.shape[-1], device=key.device).expand_as(order))
    return key.masked_fill(cand & (rank < limit), POS_INF)
