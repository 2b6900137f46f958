"""A random-weight checkpoint with a named model's layer shape, for cost benchmarks offline.

    python benchmarks/shape_model.py --shape llama-3.1-8b --layers 2 --out /tmp/llama8b-shape
    python benchmarks/bench_runtime.py --model /tmp/llama8b-shape --contexts 4096 --budget 256 \
        --intervals 1 --repeats 3 --pattern snapkv,kvzip --paired-to snapkv

What a pattern costs beside the model's own forward depends on the layer's shape (how much of a
prefill is attention and how much the MLPs), not on the trained weights: a reconstruction pass costs
a forward over the prompt whatever the weights are. The default model (SmolLM2-135M) is narrow, so at
4k tokens attention is a large share of its prefill; the layers of an 8B model are wide, and its MLPs
dominate. This writes a checkpoint with a named model's layer shape (hidden size, heads, KV heads,
MLP width, RoPE base), a few of its layers and the default model's tokenizer and vocabulary (the
output head computes the last token's logits only, so the vocabulary's size barely matters), with
random weights, so that cost ratios can be measured on that shape without downloading the model.
Its outputs mean nothing: use it for time and memory only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from polykv_search.models import DEFAULT_MODEL, model_path

#: layer shapes from the models' published configs (config.json on the hub)
SHAPES: dict[str, dict] = {
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
    },
    "smoke": {  # a small stand-in for the CPU smoke runs of benchmarks/gpu_check.py (seconds, not a real model)
        "hidden_size": 256,
        "intermediate_size": 896,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "rope_theta": 500000.0,
    },
    "qwen3-8b-like": {  # Qwen3-8B's widths in a Llama layer (no q/k norm): the cost of its shape
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 1000000.0,
    },
}


def build(shape: str | dict, layers: int, tokenizer, seed: int = 0) -> LlamaForCausalLM:
    """The random-weight model of ``shape`` (a name in :data:`SHAPES` or the config fields) with ``layers``
    layers and ``tokenizer``'s vocabulary."""
    fields = SHAPES[shape] if isinstance(shape, str) else shape
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_hidden_layers=layers,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **fields,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[2], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder (written atomically)")
    args = ap.parse_args(argv)
    if args.layers < 1:
        ap.error(f"--layers must be at least 1, got {args.layers}")
    if args.out.exists():
        ap.error(f"--out {args.out} exists; give a new folder")
    tokenizer = AutoTokenizer.from_pretrained(model_path(DEFAULT_MODEL), local_files_only=True)
    model = build(args.shape, args.layers, tokenizer, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{args.out.name}.", dir=args.out.parent)
    try:  # written beside, then renamed: no half-written checkpoint under --out
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, args.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {args.shape} layer shape, {args.layers} layers, {params / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
