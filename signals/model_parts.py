"""The few model modules the replay calls directly: embeddings, RoPE, decoder layers, final norm, head.

The replay never copies a model's forward; it calls the model's own modules in the order its forward
does (embed → rotary → each decoder layer → norm → head), with ``attention_mask=None`` because the
registered ``polykv`` attention builds every layer's mask itself. Supported: the architectures of
:data:`polykv_search.runtime.SUPPORTED` (Llama, Mistral, Qwen2, Qwen3), whose decoder layers share
one signature.
"""

from __future__ import annotations

import torch

from polykv_search.runtime.view import SMALL_OP_THREADS, cpu_threads  # noqa: F401  (re-exported)


def base_model(model):
    """The decoder stack (``model.model`` for ``*ForCausalLM``)."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return inner
    return model.get_decoder()


def decoder_layers(model):
    return base_model(model).layers


def embed(model, ids: torch.Tensor) -> torch.Tensor:
    """Input embeddings of ``ids`` ``[B, q]``."""
    return model.get_input_embeddings()(ids)


def positions(start: int, stop: int, device) -> torch.Tensor:
    """``position_ids`` ``[1, stop - start]``."""
    return torch.arange(start, stop, device=device)[None]


def rotary(model, hidden: torch.Tensor, position_ids: torch.Tensor):
    """``(cos, sin)`` for ``position_ids`` (broadcast over the batch)."""
    return base_model(model).rotary_emb(hidden, position_ids)


def slice_rotary(pe, start: int, stop: int):
    cos, sin = pe
    return cos[:, start:stop], sin[:, start:stop]


def run_layer(model, layer_idx: int, hidden: torch.Tensor, pe, position_ids: torch.Tensor, cache) -> torch.Tensor:
    """One decoder layer's forward with ``cache`` (its output hidden states)."""
    out = decoder_layers(model)[layer_idx](
        hidden,
        attention_mask=None,
        position_embeddings=pe,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
    )
    return out[0] if isinstance(out, tuple) else out


def logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """Final norm and LM head (fp32 logits)."""
    return model.get_output_embeddings()(base_model(model).norm(hidden)).float()
