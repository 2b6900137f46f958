"""Model-specific facts, in one place: which architectures the runtime supports, their shapes and
their rotary embedding.

Everything else (q/k norms of Qwen3, RoPE, fused projections) happens inside the model's own
forward before the registered attention function is called, so no forward code is needed here.
Patterns that need RoPE itself (Expected Attention rotates query statistics) get the model's own
rotary embedding through :class:`ModelRotary`, wired into every cache layer by the runtime. Where the
attention modules live, what they read and their output projection (KVzip+'s pass inputs,
:func:`attention_modules` and :func:`attention_pass_inputs`) are model facts too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from polykv_search.patterns.base import PassInputs

#: ``config.model_type`` values whose attention modules call ``cache.update`` then the registered
#: attention function with post-RoPE ``[B, H, q, D]`` tensors (tested with tiny random models).
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The runtime does not support this architecture."""


@dataclass(frozen=True)
class ModelSpec:
    config: object
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attn_implementation: str
    #: The model's rotary embedding (``positions -> (cos, sin)``), or None when it has none.
    rotary: ModelRotary | None = field(default=None, compare=False, repr=False)

    @property
    def scaling(self) -> float:
        return self.head_dim**-0.5

    def sliding_window(self, layer_idx: int) -> int | None:
        """The layer's sliding window in tokens, or None for full attention."""
        c = self.config
        types = getattr(c, "layer_types", None)
        if types is not None and types[layer_idx] != "sliding_attention":
            return None
        if self.model_type == "qwen2" and not getattr(c, "use_sliding_window", False):
            return None
        return getattr(c, "sliding_window", None)

    def bytes_per_token(self, dtype_bytes: int) -> int:
        """KV bytes one token costs in one layer (keys + values, all KV heads)."""
        return 2 * self.num_kv_heads * self.head_dim * dtype_bytes


class ModelRotary:
    """The model's own rotary embedding as ``positions -> (cos, sin)``, each ``[len(positions), D]``
    float32 on the embedding's device: a query or key at position ``p`` is rotated as
    ``x * cos[p] + rotate_half(x) * sin[p]`` (``rotate_half(x) = cat(-x2, x1)``; ``cos``/``sin``
    carry the RoPE type's attention scaling, as the model's own do).

    It calls the rotary module's forward undecorated, so a RoPE type that updates its frequencies
    in the forward (``dynamic``, ``longrope``) answers with the frequencies it holds now and is never
    changed by a pattern asking about future positions. Copies (``copy.deepcopy`` of a cache layer)
    share the module. The answers for the last few position ranges are cached (every layer asks for
    the same ones at a decoding step); treat them as read-only.
    """

    #: position ranges remembered
    CACHED = 8

    def __init__(self, module: torch.nn.Module):
        self.module = module
        forward = type(module).forward
        self._forward = getattr(forward, "__wrapped__", forward)
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, positions: torch.Tensor | range) -> tuple[torch.Tensor, torch.Tensor]:
        freq = self.module._buffers.get("inv_freq")  # a replaced or updated buffer invalidates the cache
        device = freq.device if freq is not None else next(iter(self.module.buffers()), torch.empty(0)).device
        if not isinstance(positions, range):
            return self._compute(positions.to(device), device)
        key = (positions.start, positions.stop, device, id(freq), 0 if freq is None else freq._version)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._compute(torch.arange(positions.start, positions.stop, device=device), device)
            if len(self._cache) >= self.CACHED:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = hit
        return hit

    def _compute(self, pos: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.empty(0, dtype=torch.float32, device=device)
        cos, sin = self._forward(self.module, x, pos.reshape(1, -1))
        return cos[0].float(), sin[0].float()

    def __deepcopy__(self, memo) -> ModelRotary:
        return self


def _rotary_module(model) -> torch.nn.Module | None:
    inner = getattr(model, "model", None)
    base = inner if inner is not None and hasattr(inner, "rotary_emb") else model.get_decoder()
    return getattr(base, "rotary_emb", None)


def model_spec(model) -> ModelSpec:
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(
            f"architecture {model_type!r} is not supported by the polykv runtime (supported: {', '.join(SUPPORTED)})"
        )
    heads = config.num_attention_heads
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl not in ("sdpa", "eager") and not impl.startswith("flash_attention"):
        raise UnsupportedModelError(f"attention implementation {impl!r} is not supported (use sdpa or eager)")
    return ModelSpec(
        config=config,
        model_type=model_type,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        attn_implementation=impl,
        rotary=None if (module := _rotary_module(model)) is None else ModelRotary(module),
    )


def attention_modules(model) -> list[torch.nn.Module]:
    """Each decoder layer's attention module in layer order (``self_attn`` in every supported architecture)."""
    return [layer.self_attn for layer in model.get_decoder().layers]


def attention_pass_inputs(module: Any, args: tuple, kwargs: dict) -> PassInputs:
    """What the attention ``module`` reads beyond its queries in a call with these forward arguments (a forward
    pre-hook's): the norms ``[B, q]`` of its input hidden states (after the decoder layer's input norm) and its
    output projection per query head ``[Hq, Dv, hidden]`` (``o_proj.weight`` is ``[hidden, Hq * Dv]``, query
    heads in order; a view, no copy)."""
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    weight = module.o_proj.weight
    out_proj = weight.T.reshape(-1, module.head_dim, weight.shape[0])
    return PassInputs(hidden_norm=hidden.detach().float().norm(dim=-1), out_proj=out_proj.detach())
