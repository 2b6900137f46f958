"""SnapKV's window attention kept between calls: each call computes only what is new.

SnapKV scores the cache by the attention of its last ``w`` queries. Recomputed at every decoding step,
that is ``w`` queries against every kept key (``w`` times the attention of the step itself). Between two
steps little changes: the window slides by the new queries, the eviction drops some keys, the call appends
new ones. So the masked logits ``scaling * q . k`` of the window are kept in the state's ``memo``
(:class:`WindowLogits`) and each call

- keeps the logits of the queries still in the window against the keys still held (a gather, matched by
  position: a key at a position never changes while a state follows its layer);
- gives those queries ``-inf`` against the new keys (they are older than every new key: causally hidden);
- computes the new queries' logits against every key, masked as the layer masks them.

The softmax runs over the result as before. The logits are those of the full computation, each product
computed once instead of at every step (a dot product computed in another matrix shape may differ in its
last bits). Where the memo cannot serve, :func:`window_probs` returns None and SnapKV computes everything
(the reference): padding that is not a per-row tail (left padding), a sliding window, a query that may see
no key (its row would be NaN, which layers treat differently), a memo from another window or cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from polykv_search.patterns.state import PatternState

if TYPE_CHECKING:  # pragma: no cover
    from polykv_search.patterns.base import LayerView

MEMO = "window_logits"
#: The position of a padding slot in :attr:`WindowLogits.key_pos`: past every real one, so rows stay sorted.
_PAST = 2**62


@dataclass
class WindowLogits:
    """The window's masked logits over the held keys, as of one call.

    Attributes
    ----------
    logits : torch.Tensor
        ``[B, Hkv, g, w, n + 1]`` fp32: query ``i`` of the window (query head ``h * g + j``) against slot ``s``;
        ``-inf`` where masked, on padding and in the extra last column (the gather's "no key here").
    key_pos : torch.Tensor
        ``[B, Hkv, n]`` long: the position each slot held, padding at ``_PAST`` (ascending in every row).
    query_pos : range
        Positions of the window's ``w`` queries.
    seen : int
        Tokens the layer had seen: keys at positions ``>= seen`` are new to the memo.
    """

    logits: torch.Tensor
    key_pos: torch.Tensor
    query_pos: range
    seen: int


def window_probs(layer: LayerView, state: PatternState) -> torch.Tensor | None:
    """Softmax attention ``[B, Hq, w, n]`` (fp32) of the window ``state.row["query"]`` at
    ``state.shared["query_pos"]`` over the layer's keys, as ``layer.attention_probs`` computes it, from the
    memo where it serves (updating it); None where the memo cannot serve (module docstring)."""
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
    memo = state.memo.get(MEMO)
    logits = None if memo is None else _advance(memo, layer, query, qpos, counts)
    if logits is None:
        logits = query.new_empty(b, h, g, w, n + 1, dtype=torch.float32)
        logits[..., :n] = _new_rows(layer, query, qpos)
        logits[..., n] = float("-inf")
    slot = torch.arange(n, device=pos.device)
    key_pos = pos.masked_fill(slot >= counts[:, None, None], _PAST)
    state.memo[MEMO] = WindowLogits(logits, key_pos, qpos, layer.seen)
    return logits[..., :n].softmax(dim=-1).view(b, hq, w, n)


def _compact_counts(layer: LayerView) -> torch.Tensor | None:
    """Tokens of each row ``[B]`` when every row holds its tokens in slots ``0..count-1`` of every head."""
    if layer.all_valid:
        return torch.full((layer.positions.shape[0],), layer.length, device=layer.positions.device)
    return layer.row_counts()


def _new_rows(layer: LayerView, query: torch.Tensor, qpos: range) -> torch.Tensor:
    """Masked logits ``[B, Hkv, g, q, n]`` of ``query`` ``[B, Hq, q, D]`` at ``qpos`` against every key, with the
    operations of ``layer.attention_probs`` (so a memo made from scratch gives its probabilities bit for bit)."""
    b, hq, q, d = query.shape
    h = layer.num_kv_heads
    keys = layer.keys
    n = keys.shape[-2]
    scaled = query.float().reshape(b, h, hq // h * q, d) * layer.scaling
    logits = torch.matmul(scaled, keys.float().transpose(-1, -2)).view(b, h, hq // h, q, n)
    allowed = layer.allowed(qpos)  # broadcastable to [B, Hkv, q, n]
    return logits.masked_fill_(~allowed[..., :n][:, :, None], float("-inf"))


def _advance(
    memo: WindowLogits, layer: LayerView, query: torch.Tensor, qpos: range, counts: torch.Tensor
) -> torch.Tensor | None:
    """The memo's logits moved to this call (``[B, Hkv, g, w, n + 1]``), or None when it does not match it."""
    b, hq, w, d = query.shape
    h = layer.num_kv_heads
    g = hq // h
    old = memo.logits
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
    column = torch.where(held, at, n_old)  # the memo's extra column is -inf: new keys and padding
    logits = old.new_empty(b, h, g, w, n + 1)
    if kept_rows:
        src = old[:, :, :, drop:, :]
        logits[:, :, :, :kept_rows, :n] = src.gather(-1, column[:, :, None, None, :].expand(b, h, g, kept_rows, n))
    if fresh:
        logits[:, :, :, kept_rows:, :n] = _new_rows(layer, query[..., kept_rows:, :], qpos[kept_rows:])
    logits[..., n] = float("-inf")
    return logits
