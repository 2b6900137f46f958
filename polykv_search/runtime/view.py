"""`ViewOps`: the read side of a layer's cache that patterns use (:class:`~polykv_search.patterns.base.LayerView`).

A mixin over the attributes every runtime layer and row view has: ``keys``/``positions``/``valid``
``[B, Hkv, n, ...]``, ``all_valid``, ``length``, ``seen`` (tokens seen), ``num_evictions``,
``query_range``, ``sliding_window``, ``num_kv_heads``, ``groups``, ``scaling``, ``device`` and ``rotary`` (the
model's :class:`~polykv_search.runtime.architectures.ModelRotary`, or None for a layer built without a
model). Masks are built from the absolute positions each slot holds, so they are exact whatever was
evicted.

The attention kernels read a layer's cache the same way: :func:`kernel` is exact attention under the kernel
the model was loaded with (SDPA or eager) with a layer's own bool mask; :func:`flash_with_lse` is SDPA's CPU
flash kernel of a masked call together with its log-sum-exp, which a reconstruction pass hands to model-level
patterns (:mod:`polykv_search.runtime.reconstruction`). :func:`small_ops` runs the many small per-row
operations (pattern hooks, evictions, cache bookkeeping) on one CPU thread: spreading a tiny op over threads
costs more than it gains, and a lot on a loaded machine, where a thread waiting at a barrier for a descheduled
sibling stalls every op; the weight matmuls keep the process's thread count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend


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
    #: ``mask(layer, query_positions)`` replaces :meth:`allowed` (None: the kept positions decide).
    mask: Callable[..., torch.Tensor] | None = None

    if TYPE_CHECKING:  # read-only here: some views compute them

        @property
        def values(self) -> torch.Tensor: ...

        @property
        def all_valid(self) -> bool: ...

        @property
        def length(self) -> int: ...

    def allowed(self, query_positions: torch.Tensor | range) -> torch.Tensor:
        """Bool mask broadcastable to ``[B, Hkv, q, n]``: which cached keys each query may attend to (``mask``'s, else
        :meth:`kept_allowed`)."""
        return self.kept_allowed(query_positions) if self.mask is None else self.mask(self, query_positions)

    def kept_allowed(self, query_positions: torch.Tensor | range) -> torch.Tensor:
        """:meth:`allowed` by the kept positions. Before any eviction and without padding, every row and head holds
        positions ``0..n-1``, so the mask is one ``[1, 1, q, n]`` causal (and sliding-window) pattern for all."""
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

    def kernel_mask(self, q_len: int) -> tuple[torch.Tensor | None, bool]:
        """The mask of the call in progress for the attention kernel, or ``None`` (+ causal flag) when a plain kernel
        call is exact."""
        window_ok = self.sliding_window is None or self.seen <= self.sliding_window
        if window_ok and self.all_valid:
            if q_len == 1:
                return None, False  # every kept key is in the past
            if self.length == q_len and self.num_evictions == 0:
                return None, True  # a fresh prompt: plain causal
        return self.allowed(self.query_range), False

    def row_counts(self) -> torch.Tensor | None:
        """None: rows are not known to be stored compactly (see :class:`~polykv_search.runtime.row_batch.RowCell`)."""
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


def rows_mask(layer, query_positions) -> torch.Tensor:
    """The ``mask`` of compactly stored rows (a row batch): the newest query sees exactly the valid slots, one
    ``[R, 1, 1, n]`` mask for all heads; other queries see what :meth:`ViewOps.kept_allowed` says."""
    if not layer.all_valid and newest_only(layer, query_positions):
        return layer.valid[:, :1, None, :]
    return layer.kept_allowed(query_positions)


# ------------------------------------------------------------------------ the attention kernels
def run(
    impl: str, query, key, value, mask, scaling, *, is_causal: bool = False, lse: bool = False, masks=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's attention kernel ``impl`` (``"sdpa"`` or ``"eager"``): output ``[B, q, Hq, D]`` and, when
    ``lse`` asks for it and the kernel computes one (SDPA's CPU flash kernel on a masked call,
    :func:`flash_with_lse`, ``masks`` its memo), its log-sum-exp ``[B, Hq, q]``, else None."""
    if lse and impl == "sdpa" and not is_causal:
        got = flash_with_lse(query, key, value, mask, scaling, masks)
        if got is not None:
            return got
    return kernel(impl, query, key, value, mask, scaling, is_causal=is_causal), None


def kernel(impl: str, query, key, value, mask, scaling, *, is_causal: bool = False):
    """Exact attention; ``mask`` is bool ``[B, Hkv or 1, q, n]`` (True = attend) or None."""
    groups = query.shape[1] // key.shape[1]
    if impl == "sdpa":
        if groups > 1 and mask is not None and mask.shape[1] > 1:
            return _grouped_sdpa(query, key, value, mask, scaling, groups)
        # Without a per-head mask, SDPA's native GQA avoids copying K/V per query head.
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            is_causal=is_causal and mask is None,
            scale=scaling,
            enable_gqa=groups > 1,
        )
        return out.transpose(1, 2).contiguous()
    if mask is not None and groups > 1 and mask.shape[1] > 1:
        mask = mask.repeat_interleave(groups, dim=1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if mask is None and is_causal:
        mask = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
    if mask is not None:
        weights = weights.masked_fill(~mask, torch.finfo(weights.dtype).min)
    weights = weights.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous()


def _grouped_sdpa(query, key, value, mask, scaling, groups: int) -> torch.Tensor:
    """SDPA with a per-KV-head mask without copying K/V per query head: the query heads of each KV
    head are folded into its query axis (``[B, Hkv, g*q, D]``) and the mask is repeated over them."""
    b, hq, q, d = query.shape
    h, n = key.shape[1], key.shape[-2]
    folded = query.reshape(b, h, groups * q, d)
    mask = mask[:, :, None].expand(b, h, groups, q, n).reshape(b, h, groups * q, n)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, hq, q, d).transpose(1, 2).contiguous()


def flash_with_lse(
    query, key, value, mask, scaling, masks: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`kernel` ``("sdpa", ...)`` of a masked call (bool ``mask``
    ``[B, Hkv or 1, q, n]``), output ``[B, q, Hq, D]``, and its log-sum-exp ``[B, Hq, q]``, from the CPU
    flash kernel SDPA itself runs; None where SDPA would run another kernel. ``masks``: a dict that
    remembers the last mask and its additive form (SDPA's conversion of a bool mask) for the next call (every
    layer of a pass call has the same mask)."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None or mask is None or mask.dtype != torch.bool or query.device.type != "cpu":
        return None
    b, hq, q, d = query.shape
    h, n = key.shape[1], key.shape[-2]
    groups = hq // h
    if groups > 1 and mask.shape[1] > 1:  # as _grouped_sdpa: query heads folded per KV head
        query = query.reshape(b, h, groups * q, d)
        mask = mask[:, :, None].expand(b, h, groups, q, n).reshape(b, h, groups * q, n)
        gqa = False
    else:
        gqa = groups > 1
    choice = torch._fused_sdp_choice(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    if choice != SDPBackend.FLASH_ATTENTION.value:
        return None
    masks = {} if masks is None else masks
    last = masks.get("last")  # (bool mask, its additive form): one entry, replaced whole (threads share it)
    if last is None or last[0].shape != mask.shape or last[1].dtype != query.dtype or not torch.equal(last[0], mask):
        additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~mask, float("-inf"))
        last = masks["last"] = (mask, additive)
    additive = last[1]
    out, lse = op(query, key, value, 0.0, False, attn_mask=additive, scale=scaling)
    return out.reshape(b, hq, q, -1).transpose(1, 2).contiguous(), lse.reshape(b, hq, q)


#: intra-op threads for small operations
SMALL_OP_THREADS = 1


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run a block with ``n`` intra-op CPU threads (``None``: unchanged)."""
    old = torch.get_num_threads()
    if n is None or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def small_ops():
    """The context for a block of small operations."""
    return cpu_threads(SMALL_OP_THREADS)
