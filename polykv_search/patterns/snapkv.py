"""SnapKV: observation-window attention, pooled, GQA-group mean.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", NeurIPS 2024,
https://arxiv.org/abs/2404.14469
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from polykv_search.patterns.base import NEG_INF, POS_INF, LayerView, Pattern, protected_ends
from polykv_search.patterns.state import PatternState
from polykv_search.patterns.window_attention import window_votes


@dataclass(frozen=True)
class SnapKV(Pattern):
    """Score tokens by the attention of the last ``window`` queries, pooled along the sequence.

    Parameters
    ----------
    window : int
        Observation window: the newest queries whose attention scores the cache; the window's own
        tokens are always kept (capped at the budget). Defaults follow the SnapKV code.
    kernel : int
        Pooling kernel (odd), applied along the token axis.
    pooling : {"avgpool", "maxpool"}

    In decoding the window is the last ``window`` queries seen (prompt tail, then decoded tokens). Its
    attention is kept between calls (:mod:`~polykv_search.patterns.window_attention`): a decoding step
    computes the new query's row, not the whole window again.
    """

    name: ClassVar[str] = "snapkv"
    #: Keep the window's attention between calls (False: recompute them at every call, the reference path).
    incremental: ClassVar[bool] = True
    window: int = 32
    kernel: int = 5
    pooling: str = "avgpool"

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if not isinstance(self.kernel, int) or self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be a positive odd integer, got {self.kernel!r}")
        if self.pooling not in ("avgpool", "maxpool"):
            raise ValueError(f"pooling must be 'avgpool' or 'maxpool', got {self.pooling!r}")

    def pre_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        old_q, old_pos = state.row.get("query"), state.shared.get("query_pos")
        qpos = layer.query_range
        q = query.shape[-2]
        if (
            old_q is not None
            and old_pos is not None
            and old_q.shape[0] == query.shape[0]
            and old_pos.stop == qpos.start
        ):
            qpos = range(old_pos.start, qpos.stop)  # the calls' positions follow each other
            if q < self.window:
                window = _slide(old_q, query, self.window)
            else:
                window = query[..., -self.window :, :]
        else:
            window = query[..., -self.window :, :]
        state.row["query"] = window
        state.shared["query_pos"] = qpos[-self.window :]

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        votes = window_votes(layer, state) if self.incremental else None  # [B, Hq, n]
        if votes is None:
            probs = layer.attention_probs(state.row["query"], state.shared["query_pos"])  # [B, Hq, w, n]
            votes = probs.sum(dim=-2)
        if layer.all_valid:  # the window is the newest slots: zero them in place
            votes[..., votes.shape[-1] - min(self.window, votes.shape[-1]) :] = 0.0
        else:
            window = protected_ends(layer, votes.shape[-1], 0, self.window)
            votes = votes.masked_fill(layer.repeat_heads(window), 0.0)  # the window does not vote for itself
        b, h, n = votes.shape
        flat = votes.reshape(b * h, 1, n)
        pad = self.kernel // 2
        if self.pooling == "avgpool":
            pooled = F.avg_pool1d(flat, self.kernel, stride=1, padding=pad)
        else:
            pooled = F.max_pool1d(flat, self.kernel, stride=1, padding=pad)
        return layer.group_mean(pooled.reshape(b, h, n))

    def selection_key(
        self, layer: LayerView, state: PatternState, budgets: Sequence[int], rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        single = layer.all_valid and len(set(budgets)) == 1
        counts = None if single else layer.row_counts()
        if not single and counts is None:
            return super().selection_key(layer, state, budgets, rows)
        key = self.score(layer, state).float()
        sel = None if rows is None else torch.tensor(list(rows), device=key.device)
        if sel is not None:
            key = key.index_select(0, sel)
        if single:  # protected_ends without padding is the newest min(window, budget) slots: in place
            key[..., key.shape[-1] - min(self.window, budgets[0]) :] = POS_INF
            return key
        # compact rows (row e's tokens in slots 0..count-1): the same ends, each row at its own budget
        assert counts is not None
        count = counts if sel is None else counts.index_select(0, sel)
        recent = torch.tensor([min(self.window, b) for b in budgets], device=key.device)
        slot = torch.arange(key.shape[-1], device=key.device)
        count, recent = count[:, None, None], recent[:, None, None]
        key = key.masked_fill((slot >= count - recent) & (slot < count), POS_INF)
        return key.masked_fill(slot >= count, NEG_INF)

    def protected(self, layer: LayerView, budget: int) -> torch.Tensor:
        return protected_ends(layer, budget, 0, self.window)


def _slide(old: torch.Tensor, query: torch.Tensor, window: int) -> torch.Tensor:
    """The last ``window`` queries of ``old`` then ``query``, as a view of a preallocated buffer.

    ``old`` is extended in place when it is the filled tail of such a buffer (``_polykv_fill`` marks
    how far the buffer is written); otherwise (a prompt's queries, a copied or reordered state, a
    window someone else already extended) the tail moves to a fresh buffer. New queries land past
    every view handed out earlier, so an earlier window never changes.
    """
    q = query.shape[-2]
    buf: torch.Tensor | None = old._base
    fill = None if buf is None else getattr(buf, "_polykv_fill", None)
    hi = None
    if buf is not None and fill is not None and old.stride() == buf.stride():
        hi = (old.storage_offset() - buf.storage_offset()) // buf.stride(-2) + old.shape[-2]
        if hi != fill or old.shape[:2] != buf.shape[:2] or hi + q > buf.shape[-2]:
            hi = None
    if hi is None:
        old = old[..., max(old.shape[-2] + q - window, 0) :, :]
        b, h, _, d = query.shape
        buf = query.new_empty(b, h, 2 * window, d)
        hi = old.shape[-2]
        buf[..., :hi, :] = old
    assert buf is not None
    buf[..., hi : hi + q, :] = query
    buf._polykv_fill = hi + q  # type: ignore[attr-defined]  # a mark on our own buffer
    return buf[..., max(hi + q - window, 0) : hi + q, :]
