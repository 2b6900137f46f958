"""The registered attention function ``polykv`` and its mask function.

transformers builds one mask per forward for all layers; once layers hold different tokens that mask
is wrong. So the mask function registered for ``polykv`` only forwards the 2-D padding mask, and the
attention function builds each layer's own mask from the positions its cache layer keeps, then calls
the kernel the model was loaded with (SDPA or eager).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

if TYPE_CHECKING:  # pragma: no cover
    from polykv_search.runtime.base_layer import RuntimeLayer
    from polykv_search.runtime.runtime import PolyKVRuntime

ATTN_NAME = "polykv"

#: The key under which a cache layer's ``update`` hands ``(runtime, layer)`` to the attention call that follows.
#: transformers' attention modules (llama, mistral, qwen2, qwen3) pass one ``kwargs`` dict to
#: ``cache.update(..., kwargs=kwargs)`` and then to the attention function (``**kwargs``).
LAYER_KEY = "polykv_layer"
#: The key under which the runtime's forward hook hands itself to a forward that runs without any cache.
PLAIN_KEY = "polykv_plain"
#: The key under which a reconstruction pass that needs them hands each attention call its
#: :class:`~polykv_search.patterns.base.PassInputs` (a forward pre-hook on the attention modules adds it to
#: their ``kwargs``: :func:`polykv_search.runtime.reconstruction.handing_pass_inputs`).
PASS_KEY = "polykv_pass_inputs"


def publish(call: dict | None, runtime: PolyKVRuntime, layer: RuntimeLayer) -> None:
    """Hand ``layer`` (just updated) and its ``runtime`` to the attention call whose ``kwargs`` are ``call``."""
    if call is not None:
        call[LAYER_KEY] = (runtime, layer)


def padding_mask_passthrough(*, attention_mask=None, **_) -> torch.Tensor | None:
    """Mask function for ``polykv``: hand the 2-D padding mask (or None) to every layer unchanged."""
    return attention_mask


def polykv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention with per-layer masks and the eviction hook points (``pre_kernel``, ``post_kernel``,
    ``cache_update``)."""
    scaling = module.scaling if scaling is None else scaling
    sliding = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    padding = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 else None
    runtime, layer = kwargs.get(LAYER_KEY) or (kwargs.get(PLAIN_KEY), None)
    if layer is None and runtime is not None:  # no cache at all (use_cache=False): plain causal attention
        mask = _stateless_mask(query.shape[-2], key.shape[-2], padding, sliding, query.device)
        return runtime.kernel(query, key, value, mask, scaling, is_causal=mask is None)[0], None
    if layer is None or not runtime.active:
        raise RuntimeError(
            f"polykv-search: layer {module.layer_idx}'s attention ran with attention implementation 'polykv', but "
            "its cache layer was not updated first by a strategy applied with polykv_search.runtime.apply_strategy "
            "(a cache the runtime did not build, a forward that bypasses it, or no strategy applied); refusing to "
            "run attention without eviction"
        )

    if key is not layer.keys:
        raise RuntimeError(
            f"polykv-search: layer {module.layer_idx}'s attention got keys that are not its cache layer's "
            "(the model changed them after cache.update); refusing to attend over a cache it does not hold"
        )

    def attend(layer, query, inputs):
        q_len = query.shape[-2]

        def kernel():
            mask, is_causal = _layer_mask(layer, q_len)
            lse = layer.pass_prompt is not None  # a reconstruction call: the patterns read the log-sum-exp
            return runtime.kernel(query, layer.keys, layer.values, mask, scaling, is_causal=is_causal, lse=lse)

        return layer.attention_call(query, _align_padding(padding, layer.seen, q_len), kernel, inputs=inputs)

    # one kernel per store (a layer of groups: several)
    return layer.attention_call_grouped(query, attend, kwargs.get(PASS_KEY)), None


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


def _layer_mask(layer, q_len: int) -> tuple[torch.Tensor | None, bool]:
    """The layer's mask, or ``None`` (+ causal flag) when a plain kernel call is exact."""
    n = layer.length
    window_ok = layer.sliding_window is None or layer.seen <= layer.sliding_window
    if window_ok and layer.all_valid:
        if q_len == 1:
            return None, False  # every kept key is in the past
        if n == q_len and layer.num_evictions == 0:
            return None, True  # a fresh prompt: plain causal
    return layer.allowed(layer.query_range), False


def _stateless_mask(q_len, kv_len, padding, sliding, device) -> torch.Tensor | None:
    if padding is None and sliding is None and q_len == kv_len:
        return None
    qpos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    kpos = torch.arange(kv_len, device=device)[None, :]
    allowed = kpos <= qpos
    if sliding is not None:
        allowed &= (qpos - kpos) < sliding
    allowed = allowed[None, None]
    if padding is not None:
        allowed = allowed & padding[:, None, None, -kv_len:].bool()
    return allowed | (kpos == qpos)[None, None]


def _align_padding(padding: torch.Tensor | None, seen: int, q_len: int) -> torch.Tensor | None:
    """Return a padding mask indexed by sequence position, accepting full-length or call-length masks."""
    if padding is None:
        return None
    if padding.shape[-1] == seen:
        return padding
    if padding.shape[-1] == q_len:
        return F.pad(padding, (seen - q_len, 0), value=True)
    raise ValueError(
        f"attention_mask has length {padding.shape[-1]}, expected {seen} (all tokens so far) or {q_len} (this call)"
    )


def register() -> None:
    """Register ``polykv`` with transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(ATTN_NAME, polykv_attention)
    AttentionMaskInterface.register(ATTN_NAME, padding_mask_passthrough)
