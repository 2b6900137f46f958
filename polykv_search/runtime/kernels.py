"""How the runtime computes: the attention kernels over a layer's store, and the CPU threads of its small ops.

:func:`kernel` is exact attention under the kernel the model was loaded with (SDPA or eager) with a layer's
own bool mask; :func:`flash_with_lse` is SDPA's CPU flash kernel of a masked call together with its
log-sum-exp, which a reconstruction pass hands to model-level patterns
(:mod:`polykv_search.runtime.reconstruction`).

:func:`small_ops` runs the many small per-row operations (pattern hooks, evictions, cache bookkeeping) on
one CPU thread: spreading a tiny op over threads costs more than it gains, and a lot on a loaded machine,
where a thread waiting at a barrier for a descheduled sibling stalls every op; the weight matmuls keep the
process's thread count.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend


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
