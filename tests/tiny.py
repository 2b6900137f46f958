"""Random-init tiny models of every supported family, for fast exact tests."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from polykv_search.runtime.reconstruction import ReconstructionInputs

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")

#: token ids of kvzip's repeat prompts for the tiny models, which have no tokenizer (``load_model``
#: attaches the real ones, built from the tokenizer, the same way)
REPEAT = ReconstructionInputs(first=(3, 4, 5, 6), later=(7, 8), suffix=(9,), overlap=3)


def tiny_model(family: str = "llama", *, attn: str = "sdpa", layers: int = 3, seed: int = 0, **overrides):
    """A float32 random-init causal LM with GQA (4 query heads, 2 KV heads), in eval mode."""
    kwargs = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if family in ("qwen3",):
        kwargs["head_dim"] = 16
    if family in ("mistral",):
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    config = AutoConfig.for_model(family, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    # Random init gives near-uniform attention and unit norm weights (so Qwen3's k_norm makes every
    # key the same length); sharper projections and random norm gains make eviction choices matter.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(4.0)
            elif "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))
    model.polykv_reconstruction = REPEAT
    return model.eval()


def rope(head_dim: int, base: float = 10000.0):
    """A standard RoPE as a layer's ``rotary`` (``positions -> (cos, sin)``), for cache layers built
    without a model."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)

    def rotary(positions):
        pos = torch.arange(positions.start, positions.stop) if isinstance(positions, range) else positions.cpu()
        freqs = pos[:, None].float() * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    return rotary
