"""Model-specific facts, in one place: which architectures the runtime supports and their shapes.

Everything else (q/k norms of Qwen3, RoPE, fused projections) happens inside the model's own
forward before the registered attention function is called, so no forward code is needed here.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    )
