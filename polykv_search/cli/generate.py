"""`polykv-search generate`: run a prompt under a strategy and report what the cache held."""

from __future__ import annotations

import argparse

from rich.table import Table

from polykv_search.cli.arg_types import non_negative_float, seed_value
from polykv_search.cli.common import (
    CLIError,
    add_decode_interval_args,
    add_model_args,
    check_model_args,
    console,
    load_model_from_args,
    out,
    print_json,
    read_text,
)
from polykv_search.cli.limits import check_fits_model, check_lengths, model_shape, token_count

DEFAULT_PROMPT = "Write two sentences about the sea."


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with a strategy applied",
        description="Prefill a prompt (compressed per the strategy) and decode; "
        "report per-layer cache lengths and KV bytes.",
    )
    add_model_args(p)
    p.add_argument("--strategy", help="strategy JSON (default: FullKV)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt-file", help="read the prompt from this file")
    src.add_argument("--prompt", help=f"the prompt text (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--max-new-tokens", type=token_count, default=64, help="tokens to generate (default 64)")
    p.add_argument("--no-chat", action="store_true", help="do not wrap the prompt in the model's chat template")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=seed_value, default=None, help="sampling seed, with --temperature > 0 (default 0)")
    add_decode_interval_args(p, default=None, help="with --strategy: evict every k decoding steps (default 1)")
    p.add_argument("--json", action="store_true", help="print a JSON record instead of text and a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from polykv_search.generation import encode_prompt, generate
    from polykv_search.models import load_tokenizer
    from strategies import Strategy

    if args.seed is not None and args.temperature == 0:
        raise CLIError("--seed applies to sampling; give --temperature > 0 (0 is greedy)")
    if args.decode_interval is not None and not args.strategy:
        raise CLIError("--decode-interval applies with --strategy (FullKV never evicts)")
    prompt = (
        read_text(args.prompt_file, "--prompt-file")
        if args.prompt_file
        else (args.prompt if args.prompt is not None else DEFAULT_PROMPT)
    )
    if not prompt.strip():
        raise CLIError("the prompt is empty")
    strategy = Strategy.load(args.strategy) if args.strategy else None
    check_model_args(args)
    if strategy is not None:
        check_fits_model([(args.strategy, strategy)], args.model)  # before the model loads
    ids = encode_prompt(load_tokenizer(args.model), prompt, chat=not args.no_chat)
    check_lengths(  # a prompt or --max-new-tokens past the model's positions or this machine's memory
        model_shape(args.model),
        context_len=ids.shape[-1],
        after=args.max_new_tokens,
        after_flag="--max-new-tokens",
        dtype=args.dtype,
        attn=args.attn,
        device=args.device,
        context_flag="a prompt of {} tokens",
    )
    model, tokenizer = load_model_from_args(args)
    if strategy is None:
        strategy = Strategy.full(model.config.num_hidden_layers, model=args.model)
    result = generate(
        model,
        tokenizer,
        ids,
        strategy,
        max_new_tokens=args.max_new_tokens,
        decode_interval=args.decode_interval or 1,
        interval_mode=args.interval_mode,
        temperature=args.temperature,
        seed=args.seed or 0,
    )
    if args.json:
        record = result.to_json()
        record["strategy"] = {"path": args.strategy, "digest": strategy.digest(), "provenance": strategy.provenance}
        record["model"] = args.model
        print_json(record)
        return 0
    out.print(result.text)
    table = Table(title="KV cache per layer", show_lines=False)
    for col in ("layer", "budget (prefill/decoding)", "after prefill", "at end"):
        table.add_column(col, justify="right")
    for a, b in zip(result.after_prefill.layers, result.at_end.layers):
        table.add_row(str(a.layer), f"{_b(a.prefill_budget)}/{_b(a.decoding_budget)}", str(a.kept), str(b.kept))
    console.print(table)
    end = result.at_end
    console.print(
        f"prompt {result.prompt_tokens} tokens, {len(result.new_tokens)} new; KV held {end.kv_bytes / 2**20:.2f} MiB "
        f"vs FullKV {end.full_kv_bytes / 2**20:.2f} MiB ({end.kv_bytes / max(end.full_kv_bytes, 1):.1%}); "
        f"prefill {result.prefill_seconds:.2f}s, decode {result.decode_tokens_per_second:.1f} tok/s"
    )
    return 0


def _b(budget: int | None) -> str:
    return "all" if budget is None else str(budget)
