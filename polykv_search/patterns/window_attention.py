"""SnapKV's window attention kept between calls: each call computes only what is new.

SnapKV scores the cache by the attention of its last ``w`` queries. Recomputed at every decoding step,
that is ``w`` queries against every kept key, logits and softmax (``w`` times the attention of the step
itself). Between two steps little changes: the window slides by the new queries, the eviction drops some
keys, the call appends new ones. So the state's ``memo`` keeps (:class:`WindowAttention`) each window query's
unnormalised weights ``exp(scaling * q . k - m)`` against the held keys (``m``: the query's largest logit when
it was computed, so every weight is at most 1), and each call

- keeps the weights of the queries still in the window against the keys still held (whole rows of ``w``
  weights per key, copied by one ``index_select``, matched by position: a key at a position never changes
  while a state follows its layer);
- gives those queries weight 0 on the new keys (they are older than every new key: causally hidden);
- computes the new queries' weights against every key, masked as the layer masks them, into the slots of
  the queries that left the window (the window's queries are a ring: their order does not matter to a sum).

Each query's weights over the held keys, divided by their sum, are its softmax: the votes
``sum_i p_i`` are one batched product ``E @ (1 / Z)``. The result equals the recomputed softmax within float
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
    flat : torch.Tensor
        ``[B * Hkv * g * n + 1, w]`` fp32: row ``((b * Hkv + h) * g + j) * n + s`` holds the weights
        ``exp(logit - m_i)`` of query head ``h * g + j`` of row ``b``, window query in ring slot ``i``, on key slot
        ``s`` (0 where masked or padding); the last row is zeros (what a new key or padding starts from).
    key_pos : torch.Tensor
        ``[B, Hkv, n]`` long: the position each slot held, padding at ``_PAST`` (ascending in every row).
    query_pos : range
        Positions of the window's ``w`` queries; the query at ``query_pos[k]`` is in ring slot ``(first + k) % w``.
    first : int
    seen : int
        Tokens the layer had seen: keys at positions ``>= seen`` are new to the memo.
    """

    flat: torch.Tensor
    key_pos: torch.Tensor
    query_pos: range
    first: int
    seen: int

    def weights(self, b: int, h: int, g: int) -> torch.Tensor:
        """``[B, Hkv, g, n, w]``: the weights without the zero row."""
        return self.flat[:-1].view(b, h, g, -1, self.flat.shape[-1])


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
    g = hq // h
    slot = torch.arange(n, device=pos.device)
    key_pos = pos.masked_fill(slot >= counts[:, None, None], _PAST)
    memo = state.memo.get(MEMO)
    moved = None if memo is None else _advance(memo, layer, query, qpos, counts, key_pos)
    if moved is None:
        flat = query.new_empty(b * h * g * n + 1, w, dtype=torch.float32)
        flat[:-1].view(b, h, g, n, w).copy_(_new_rows(layer, query, qpos).transpose(-1, -2))
        flat[-1] = 0.0
        moved = WindowAttention(flat, key_pos, qpos, 0, layer.seen)
    weights = moved.weights(b, h, g)  # [B, Hkv, g, n, w]
    total = weights.sum(dim=-2, keepdim=True)  # [B, Hkv, g, 1, w]
    if float(total.min()) < _TINY:
        state.memo.pop(MEMO, None)
        return None
    state.memo[MEMO] = moved
    return torch.matmul(weights, total.reciprocal_().transpose(-1, -2)).view(b, hq, n)


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
    memo: WindowAttention, layer: LayerView, query: torch.Tensor, qpos: range, counts: torch.Tensor, key_pos
) -> WindowAttention | None:
    """The memo moved to this call, or None when it does not match it."""
    b, hq, w, d = query.shape
    h = layer.num_kv_heads
    g = hq // h
    fresh = qpos.start - memo.query_pos.start  # queries new since the memo (the window keeps its length)
    n_old = memo.key_pos.shape[-1]
    if (
        memo.flat.shape != (b * h * g * n_old + 1, w)
        or memo.key_pos.shape[:2] != (b, h)
        or len(memo.query_pos) != w
        or not 0 <= fresh < w
        or qpos.stop - memo.query_pos.stop != fresh
        or layer.seen < memo.seen
    ):
        return None
    pos = layer.positions
    n = pos.shape[-1]
    real = torch.arange(n, device=pos.device) < counts[:, None, None]
    held = real & (pos < memo.seen)  # keys the memo saw: each must be in the memo's row, at its position
    at = torch.searchsorted(memo.key_pos, key_pos)
    found = memo.key_pos.gather(-1, at.clamp(max=max(n_old - 1, 0))) == pos if n_old else torch.zeros_like(held)
    if bool((held & ~found).any()):
        return None
    # row of the memo's flat weights for each (row, head, group, slot): its own, or the zero row
    base = (torch.arange(b * h * g, device=pos.device) * n_old).view(b, h, g, 1)
    zero = b * h * g * n_old
    index = torch.where(held[:, :, None, :], base + at[:, :, None, :], zero).reshape(-1)
    flat = memo.flat.new_empty(b * h * g * n + 1, w)
    torch.index_select(memo.flat, 0, index, out=flat[:-1])
    flat[-1] = 0.0
    if fresh:
        ring = [(memo.first + k) % w for k in range(fresh)]  # the slots of the queries that left
        rows = _new_rows(layer, query[..., w - fresh :, :], qpos[w - fresh :])  # [B, Hkv, g, fresh, n]
        flat[:-1].view(b, h, g, n, w)[..., ring] = rows.transpose(-1, -2)
    return WindowAttention(flat, key_pos, qpos, (memo.first + fresh) % w, layer.seen)
