"""The registered attention function ``polykv`` and its mask function.

transformers builds one mask per forward for all layers; once layers hold different tokens that mask
is wrong. So the mask function registered for ``polykv`` only forwards the 2-D padding mask, and the
attention function builds each layer's own mask from the positions its cache layer keeps, then calls
the kernel the model was loaded with (SDPA or eager; :func:`~polykv_search.runtime.view.run`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.view import run as run_kernel

if TYPE_CHECKING:  # pragma: no cover
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
        return run_kernel(runtime.kernel_impl, query, key, value, mask, scaling, is_causal=mask is None)[0], None
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

    run = partial(run_kernel, runtime.kernel_impl, masks=runtime.pass_masks)
    attend = partial(RuntimeLayer.attend, kernel=run, scaling=scaling, padding=padding)
    # one kernel per store (a layer of kernel groups: one per group)
    return layer.attention_call_grouped(query, attend, kwargs.get(PASS_KEY)), None


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


def register() -> None:
    """Register ``polykv`` with transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(ATTN_NAME, polykv_attention)
    AttentionMaskInterface.register(ATTN_NAME, padding_mask_passthrough)
