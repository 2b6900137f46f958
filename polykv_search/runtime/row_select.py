"""Per-row top-``b`` selection for row-batched eviction: every row of one padded key tensor keeps its
own number of slots, with the tie-breaking of :func:`~polykv_search.patterns.base.select_keep`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polykv_search.patterns.base import POS_INF, select_keep


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
