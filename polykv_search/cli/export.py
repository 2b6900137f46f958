"""`polykv-search export`: translate a strategy for another runtime (kvpress, TensorRT-LLM, vLLM)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from polykv_search.cli.arg_types import positive_int
from polykv_search.cli.common import CLIError, check_output_path, console
from polykv_search.cli.outputs import check_not_an_input


def add_parser(sub) -> None:
    from strategies.exporters import EXPORTERS

    p = sub.add_parser(
        "export",
        help="export a strategy for kvpress, TensorRT-LLM or vLLM (or as canonical JSON)",
        description="Translate a strategy.json for another runtime. json: the canonical file (a JSON Schema "
        "ships with the package); kvpress: a Python module defining a kvpress press plus its JSON sidecar; "
        "trtllm: TensorRT-LLM KvCacheConfig YAML (full and streaming_llm layers); vllm: hf_overrides JSON "
        "(full layers and one sliding window). What a format cannot express is refused with one line naming "
        "the layer, or changed with --approximate (every change is printed). Nothing is written on refusal.",
    )
    p.add_argument("strategy", help="strategy JSON (from `polykv-search solve`)")
    p.add_argument("--format", required=True, choices=list(EXPORTERS), help="target format")
    p.add_argument(
        "--out",
        required=True,
        help="file to write (kvpress: a .py module, its JSON sidecar goes beside it with .json; json, vllm: .json)",
    )
    p.add_argument(
        "--approximate",
        action="store_true",
        help="trtllm, vllm: change what the target cannot express (other patterns become sliding windows of "
        "the same budget, the prefill choice serves both phases, ...); kvpress: let head groups with a scored "
        "pattern keep every generated token while decoding; prints every change",
    )
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        help="trtllm: the engine's max sequence length, the window of full layers (needed when some layers are full)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from strategies import Strategy
    from strategies.exporters import ExportError, ExportOptions, render_export, write_export

    check_output_path(args.out)
    strategy = Strategy.load(args.strategy)
    options = ExportOptions(approximate=args.approximate, max_seq_len=args.max_seq_len)
    try:
        export = render_export(strategy, args.format, args.out, options)
        for path in export.files:  # a kvpress sidecar too: nothing is written unless every file can be
            flag = "--out" if Path(path) == Path(args.out) else f"--out {args.out}'s sidecar"
            check_output_path(path, flag)
            if args.format != "json" or flag != "--out":  # canonical JSON in place keeps the strategy
                check_not_an_input(path, flag, [("the strategy file", args.strategy)])
        written = write_export(export)
    except ExportError as err:
        raise CLIError(str(err)) from None
    for line in export.warnings:
        console.print(f"[yellow]warning:[/yellow] approximated {escape(line)}", highlight=False, soft_wrap=True)
    for line in export.notes:
        console.print(f"[dim]note:[/dim] {escape(line)}", highlight=False, soft_wrap=True)
    extra = f" (+ {', '.join(str(p) for p in written[1:])})" if len(written) > 1 else ""
    approx = (
        f", {len(export.warnings)} approximation{'s' if len(export.warnings) != 1 else ''}" if export.warnings else ""
    )
    console.print(
        f"wrote {written[0]}{extra}: {args.format}, {strategy.num_layers} layers{approx}",
        highlight=False,
        soft_wrap=True,
    )
    return 0
