"""SnapKV's window attention kept between calls: each call computes only what is new.

SnapKV scores the cache by the attention of its last ``w`` queries. Recomputed at every decoding step,
that is ``w`` queries against every kept key, logits and softmax (``w`` times the attention of the step
itself). Between two steps little changes: the window slides by the new queries, the eviction drops some
keys, the call appends new ones. So the state's ``memo`` keeps (:class:`WindowAttention`) each window query's
unnormalised weights ``exp(scaling * q . k - m)`` against the held keys (``m``: the query's largest logit when
it was computed, so every weight is at most 1), and each call

- keeps the weights of the queries still in the window against the keys still held (a gather, matched by
  position: a key at a position never changes while a state follows its layer);
- gives those queries weight 0 on the new keys (they are older than every new key: causally hidden);
- computes the new queries' weights against every key, masked as the layer masks them.

Each query's weights over the held keys, divided by their sum, are its softmax: the votes
``sum_i p_i`` are one batched product ``(1 / Z) @ E``. The result equals the recomputed softmax within float
rounding (another stabiliser than the softmax's own maximum; a dot product computed in another matrix shape
may differ in its last bits). Where the memo cannot serve, :func:`window_votes` returns None and SnapKV
computes everything (the reference): padding that is not a per-row tail (left padding), a sliding window, a
query that may see no key (its row would be NaN, which layers treat differently), weights that underflow,
a memo from another window or cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from polykv_search.patterns.state import PatternState

if TYPE_CHECKING:  # pragma: no cover
    from polykv_search.patterns.base import LayerView

MEMO = "window_attention"
#: The position of a padding slot in :attr:`WindowAttention.key_pos`: past every real one, so rows stay sorted.
_PAST = 2**62


#: A query whose weights sum below this (its best keys evicted, the rest far below them) is recomputed.
_TINY = 1e-30


@dataclass
class WindowAttention:
    """The window's unnormalised attention weights over the held keys, as of one call.

    Attributes
    ----------
    weights : torch.Tensor
        ``[B, Hkv, g, w, n + 1]`` fp32: query ``i`` of the window (query head ``h * g + j``) against slot ``s``,
        ``exp(logit - m_i)``; 0 where masked, on padding and in the extra last column (the gather's "no key").
    key_pos : torch.Tensor
        ``[B, Hkv, n]`` long: the position each slot held, padding at ``_PAST`` (ascending in every row).
    query_pos : range
        Positions of the window's ``w`` queries.
    seen : int
        Tokens the layer had seen: keys at positions ``>= seen`` are new to the memo.
    """

    weights: torch.Tensor
    key_pos: torch.Tensor
    query_pos: range
    seen: int


def window_votes(layer: LayerView, state: PatternState) -> torch.Tensor | None:
    """The votes ``[B, Hq, n]`` (fp32) of the window ``state.row["query"]`` at ``state.shared["query_pos"]``: the
    sum over its queries of their softmax attention over the layer's keys, masked as ``layer.attention_probs``
    masks it, from the memo where it serves (updating it); None where the memo cannot serve (module docstring)."""
    query, qpos = state.row["query"], state.shared["query_pos"]
    counts = _compact_counts(layer)
    if counts is None or layer.sliding_window is not None or not isinstance(qpos, range) or not len(qpos):
        state.memo.pop(MEMO, None)
        return None
    pos = layer.positions
    n = pos.shape[-1]
    # compact rows keep their oldest token in slot 0: a window query older than it in some row sees nothing
    if n == 0 or int(pos[..., 0].max()) > qpos.start:
        state.memo.pop(MEMO, None)
        return None
    b, hq, w, d = query.shape
    h = layer.num_kv_heads
    memo = state.memo.get(MEMO)
    weights = None if memo is None else _advance(memo, layer, query, qpos, counts)
    if weights is None:
        weights = query.new_empty(b, h, hq // h, w, n + 1, dtype=torch.float32)
        weights[..., :n] = _new_rows(layer, query, qpos)
        weights[..., n] = 0.0
    total = weights.sum(dim=-1, keepdim=True)  # [B, Hkv, g, w, 1]
    if float(total.min()) < _TINY:
        state.memo.pop(MEMO, None)
        return None
    slot = torch.arange(n, device=pos.device)
    key_pos = pos.masked_fill(slot >= counts[:, None, None], _PAST)
    state.memo[MEMO] = WindowAttention(weights, key_pos, qpos, layer.seen)
    votes = torch.matmul(total.reciprocal().transpose(-1, -2), weights)  # [B, Hkv, g, 1, n + 1]
    return votes[..., 0, :n].reshape(b, hq, n)


def _compact_counts(layer: LayerView) -> torch.Tensor | None:
    """Tokens of each row ``[B]`` when every row holds its tokens in slots ``0..count-1`` of every head."""
    if layer.all_valid:
        return torch.full((layer.positions.shape[0],), layer.length, device=layer.positions.device)
    return layer.row_counts()


def _new_rows(layer: LayerView, query: torch.Tensor, qpos: range) -> torch.Tensor:
    """Weights ``[B, Hkv, g, q, n]`` of ``query`` ``[B, Hq, q, D]`` at ``qpos`` against every key: the logits as
    ``layer.attention_probs`` computes and masks them, less each query's maximum, exponentiated (0: masked)."""
    b, hq, q, d = query.shape
    h = layer.num_kv_heads
    keys = layer.keys
    n = keys.shape[-2]
    scaled = query.float().reshape(b, h, hq // h * q, d) * layer.scaling
    logits = torch.matmul(scaled, keys.float().transpose(-1, -2)).view(b, h, hq // h, q, n)
    allowed = layer.allowed(qpos)  # broadcastable to [B, Hkv, q, n]
    logits.masked_fill_(~allowed[..., :n][:, :, None], float("-inf"))
    return logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()


def _advance(
    memo: WindowAttention, layer: LayerView, query: torch.Tensor, qpos: range, counts: torch.Tensor
) -> torch.Tensor | None:
    """The memo's weights moved to this call (``[B, Hkv, g, w, n + 1]``), or None when it does not match it."""
    b, hq, w, d = query.shape
    h = layer.num_kv_heads
    g = hq // h
    old = memo.weights
    drop = qpos.start - memo.query_pos.start  # window rows gone since the memo
    kept_rows = len(memo.query_pos) - drop
    fresh = w - kept_rows  # queries new since the memo
    if (
        old.shape[:3] != (b, h, g)
        or memo.key_pos.shape[:2] != (b, h)
        or layer.seen < memo.seen
        or drop < 0
        or kept_rows < 0
        or fresh < 0
        or qpos.stop - fresh != memo.query_pos.stop
    ):
        return None
    pos = layer.positions
    n, n_old = pos.shape[-1], memo.key_pos.shape[-1]
    real = torch.arange(n, device=pos.device) < counts[:, None, None]
    held = real & (pos < memo.seen)  # keys the memo saw: each must be in the memo's row, at its position
    at = torch.searchsorted(memo.key_pos, pos.contiguous())
    found = memo.key_pos.gather(-1, at.clamp(max=max(n_old - 1, 0))) == pos if n_old else torch.zeros_like(held)
    if bool((held & ~found).any()):
        return None
    column = torch.where(held, at, n_old)  # the memo's extra column is 0: new keys and padding
    weights = old.new_empty(b, h, g, w, n + 1)
    if kept_rows:
        src = old[:, :, :, drop:, :]
        weights[:, :, :, :kept_rows, :n] = src.gather(-1, column[:, :, None, None, :].expand(b, h, g, kept_rows, n))
    if fresh:
        weights[:, :, :, kept_rows:, :n] = _new_rows(layer, query[..., kept_rows:, :], qpos[kept_rows:])
    weights[..., n] = 0.0
    return weights
