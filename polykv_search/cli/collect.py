"""`polykv-search collect`: calibration signals for every layer, phase, pattern and budget.

    polykv-search collect --out signals.json     # defaults: SmolLM2 on Austen, 2 samples of 512+16 tokens
    polykv-search collect --model M --calib SPEC --samples 8 --context-len 1024 --continuation-len 128 \\
        --patterns snapkv,tova,h2o,streaming_llm,knorm,random --budgets 32,64,128,256 \\
        --phases prefill,decoding --out signals.json [--resume] [--jobs 2] [--device cuda] [--naive]

The defaults are a quick look (minutes on 2 CPU cores; the cost grows linearly with samples × m,
and with the square of the layer count); calibration-grade tables use more and longer samples, e.g.
``--samples 8 --context-len 1024 --continuation-len 128`` (see ``benchmarks/bench_collect.py``).

Finished units are journaled to ``<out>.journal``; rerunning the same command after a crash or Ctrl-C
continues from it (``--resume`` insists on it, ``--fresh`` discards it), and a journal from another
model, grid or calibration set is refused. ``--jobs N`` runs N local worker processes (joblib/loky);
``--backend dask --address tcp://host:8786`` or ``--backend ray --address auto`` use a cluster whose
workers have polykv-search installed and can load the model by the same name.

``--retrieval-mix 0.5`` (or a count, ``--retrieval-mix 2``) makes that share of the ``--samples``
*evidence samples* (:mod:`polykv_search.data.evidence`): calibration-split prose with inserted records,
codes or names with facts, a query for one of them opening the continuation and its answer after
it; their signals are computed on the answer tokens only. The mix is recorded in the table's
provenance (``retrieval``) and in its collection key; solvers read the table as any other.

``--retrieval-heads N`` and ``--head-cells [BUDGETS]`` add per-KV-head signals (retrieval scores, streaming
cells) to the table's ``heads`` block (:mod:`polykv_search.cli.collect_heads`).
"""

from __future__ import annotations

import argparse

from polykv_search.cli import collect_heads
from polykv_search.cli.arg_types import at_most, comma_list, jobs_count, pattern_specs, positive_int, seed_value
from polykv_search.cli.common import (
    CLIError,
    Interrupted,
    add_model_args,
    add_protocol_arg,
    check_model_args,
    check_output_path,
    console,
    load_model_from_args,
)
from polykv_search.cli.limits import check_backend, check_fan_out_flags, check_lengths, model_shape, token_count
from polykv_search.cli.outputs import check_not_an_input
from polykv_search.cli.score_checks import MAX_SAMPLES

# From the signal-quality measurement (README, "Signal quality per CPU-minute"): at equal tokens, many
# short samples give the lowest per-cell standard error per CPU-minute.
DEFAULT_SAMPLES = 8
DEFAULT_CONTEXT = 512
DEFAULT_CONTINUATION = 32
#: ``--samples`` (``quickstart --calib-samples``): made and held before the first runs, like score's, at most
#: :data:`~polykv_search.cli.score_checks.MAX_SAMPLES`.
calibration_count = at_most(MAX_SAMPLES, "samples")


def add_parser(sub) -> None:
    from polykv_search.patterns import PATTERNS
    from signals.collect import DEFAULT_BUDGETS, DEFAULT_PATTERNS

    p = sub.add_parser(
        "collect",
        help="collect calibration signals (cosine, dPPL, entropy) into a signal table",
        description="Collect the signal table: for every (layer, phase, pattern, budget) cell, the "
        "cosine similarity of "
        "the layer's output and the perplexity change on teacher-forced continuations when only that layer evicts; "
        "per (layer, phase) the FullKV attention entropy and variance. Fast replay by default; resumable.",
    )
    add_model_args(p)
    g = p.add_argument_group("calibration data")
    g.add_argument(
        "--calib",
        default=None,
        help="corpus spec: austen (default), debian-faq, pydoc, a .txt/.jsonl/.parquet path, hf:NAME",
    )
    g.add_argument(
        "--samples",
        type=calibration_count,
        default=DEFAULT_SAMPLES,
        help=f"calibration samples (default {DEFAULT_SAMPLES}; at most {MAX_SAMPLES:,})",
    )
    g.add_argument(
        "--context-len",
        type=token_count,
        default=DEFAULT_CONTEXT,
        help=f"context tokens n (default {DEFAULT_CONTEXT})",
    )
    g.add_argument(
        "--continuation-len",
        type=token_count,
        default=DEFAULT_CONTINUATION,
        help=f"continuation tokens m, >= 2 (default {DEFAULT_CONTINUATION})",
    )
    g.add_argument("--seed", type=seed_value, default=0, help="sample placement seed (default 0)")
    g.add_argument(
        "--retrieval-mix",
        default="0",
        metavar="MIX",
        help="retrieval-aware calibration: how many of the --samples carry synthetic evidence (records, codes, names "
        "with facts) inserted into the prose, with the answer in the continuation; a count (2), a fraction (0.5) or a "
        "percentage (25%%) of --samples; their signals are computed on the answer tokens only (default 0: prose only)",
    )
    g.add_argument(
        "--evidence-records",
        type=positive_int,
        default=None,
        metavar="N",
        help="evidence statements per evidence sample, one of them queried (default 4; 1 for --retrieval-heads)",
    )
    collect_heads.add_args(g)
    add_protocol_arg(
        g,
        "evidence samples of --retrieval-mix put their query at the end of the context, inside the compressed "
        "prompt (the question-aware protocol of `score --question-aware`), and the continuation opens with the answer; "
        "default: the query opens the continuation (question-agnostic). Recorded in the table (retrieval.protocol)",
    )
    g = p.add_argument_group("grid")
    g.add_argument(
        "--patterns",
        type=pattern_specs(),
        default=",".join(DEFAULT_PATTERNS),
        help=f"comma separated, any of {','.join(PATTERNS)}, each with parameters if wanted, e.g. "
        f"kvzip[allocation=model] (default {','.join(DEFAULT_PATTERNS)})",
    )
    g.add_argument(
        "--budgets",
        type=comma_list(positive_int, "budget"),
        default=",".join(map(str, DEFAULT_BUDGETS)),
        help=f"comma separated (default {','.join(map(str, DEFAULT_BUDGETS))})",
    )
    g.add_argument(
        "--phases",
        type=comma_list(str, "phase"),
        default="prefill,decoding",
        help="comma separated (default prefill,decoding)",
    )
    g.add_argument(
        "--layers",
        type=_layers_spec,
        default="all",
        help="layers to collect, e.g. 0-3,10 (default all; others stay missing)",
    )
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, help="where to write the signal table (JSON)")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the partial run in OUT.journal (the default when one matches); error if there is none",
    )
    g.add_argument("--fresh", action="store_true", help="discard OUT.journal and start over")
    g.add_argument(
        "--naive", action="store_true", help="one full forward per cell (the slow reference) instead of the replay"
    )
    g.add_argument(
        "--jobs",
        type=jobs_count,
        default=1,
        help="parallel workers: the grid's units and the head cells' samples; auto: one per CPU core (at most "
        "4 and one per 4 GiB of available memory; 1 on an accelerator) (default 1)",
    )
    g.add_argument(
        "--backend",
        choices=["loky", "dask", "ray"],
        default=None,
        help="joblib backend for --jobs (default loky: local processes)",
    )
    g.add_argument("--address", default=None, help="dask scheduler / ray cluster address (default: start a local one)")
    g.add_argument(
        "--batch-tokens",
        type=positive_int,
        default=8192,
        help="continuation tokens (cells x m) run at once (default 8192)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _layers_spec(text: str) -> str:
    """``all`` or ``0,5,10-12``: the syntax is checked here, the range once the model's layer count is known."""
    if text.strip() == "all":
        return "all"
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not (lo.isdigit() and (not dash or hi.isdigit())):
            raise argparse.ArgumentTypeError(f"expected 'all' or layers like 0,5,10-12, got {text!r}")
        if dash and int(hi) < int(lo):
            raise argparse.ArgumentTypeError(f"empty layer range {part.strip()!r} in {text!r}")
    return text


def check(args: argparse.Namespace):
    """Every check of ``args`` that needs no model and no corpus (quickstart runs it before its first step).

    Returns ``(out path, retrieval mix or None)``; raises :class:`CLIError` (one line)."""
    from polykv_search.data import DataError
    from polykv_search.data.evidence import DEFAULT_RECORDS, parse_retrieval_mix
    from signals.collect import CollectError, make_settings
    from signals.collect_settings import parse_layers
    from signals.journal import journal_path

    out = check_output_path(args.out)
    check_not_an_input(out, "--out", [("the --calib corpus", args.calib)])
    if args.calib is not None and not args.calib.strip():  # "" would read the default corpus
        raise CLIError("--calib: empty; give a corpus spec, or leave it out for austen")
    if args.resume and args.fresh:
        raise CLIError("--resume and --fresh contradict each other")
    if args.continuation_len < 2:
        raise CLIError("--continuation-len must be at least 2 (the continuation's own tokens are scored)")
    patterns, budgets, phases = args.patterns, args.budgets, args.phases
    if args.context_len <= max(budgets):
        raise CLIError(
            f"--context-len {args.context_len} must exceed the largest of --budgets ({max(budgets)}): "
            "a cell whose budget holds the whole context evicts nothing and measures nothing"
        )
    check_fan_out_flags(args)
    try:
        make_settings(
            1,
            patterns=patterns,
            budgets=budgets,
            phases=phases,
            layers=[0],
            naive=args.naive,
            batch_tokens=args.batch_tokens,
        )
    except CollectError as err:  # grid errors before the (slow) model load
        raise CLIError(str(err)) from None
    try:
        mix = parse_retrieval_mix(args.retrieval_mix, records=args.evidence_records or DEFAULT_RECORDS)
        if mix is not None:  # what the evidence vocabularies can supply, before anything is drawn
            mix.evidence_samples(args.samples, args.context_len)
    except DataError as err:
        message = str(err).replace("retrieval mix", "--retrieval-mix", 1)
        message = message.replace("evidence records per sample:", "--evidence-records", 1)
        raise CLIError(message.replace("context_len ", "--context-len ", 1)) from None
    heads = collect_heads.head_samples(args) if hasattr(args, "retrieval_heads") else 0
    if args.question_aware and mix is None:
        raise CLIError("--question-aware moves the query of evidence samples into the prompt; give --retrieval-mix too")
    if args.evidence_records is not None and mix is None and not heads:
        raise CLIError("--evidence-records applies to evidence samples; give --retrieval-mix or --retrieval-heads too")
    if hasattr(args, "retrieval_heads"):
        collect_heads.check(args, mix)
    if args.resume and not journal_path(out).exists():
        raise CLIError(f"--resume: nothing to resume, {journal_path(out)} does not exist")
    check_output_path(journal_path(out), "--out")
    check_model_args(args)
    check_backend(args.backend, args.address)
    shape = model_shape(args.model)
    if shape is not None and shape.layers is not None:  # --layers past the model's, before it loads
        try:
            parse_layers(args.layers, shape.layers)
        except CollectError as err:
            raise CLIError(f"--{err}; {shape.name} has {shape.layers} layers") from None
    check_lengths(
        shape,
        context_len=args.context_len,
        after=args.continuation_len,
        after_flag="--continuation-len tokens",
        dtype=args.dtype,
        attn=args.attn,
        device=args.device,
        workers=args.jobs if not args.address else 1,
    )
    return out, mix


def run(args: argparse.Namespace) -> int:
    from polykv_search.data import DEFAULT_CORPUS, describe_samples, load_corpus
    from polykv_search.data.evidence import describe_evidence, make_calibration_samples
    from polykv_search.models import load_tokenizer
    from polykv_search.protocol import AGNOSTIC, AWARE
    from signals.collect import CollectError, ModelLoader, collect_signals
    from signals.journal import journal_path

    out, mix = check(args)
    patterns, budgets, phases = args.patterns, args.budgets, args.phases
    spec = args.calib or DEFAULT_CORPUS
    with console.status(f"reading the calibration corpus {spec} ..."):
        corpus = load_corpus(spec)  # a bad --calib is refused before the (slow) model load

    with console.status(f"preparing {args.samples} calibration samples from {spec} ..."):
        tokenizer = load_tokenizer(args.model)
        samples = make_calibration_samples(  # tokens only: a corpus too short for them, before the model
            tokenizer,
            corpus,
            n_samples=args.samples,
            context_len=args.context_len,
            continuation_len=args.continuation_len,
            seed=args.seed,
            mix=mix,
            protocol=AWARE if args.question_aware else AGNOSTIC,
        )
        evidence = collect_heads.evidence_samples(args, tokenizer, corpus) if collect_heads.head_samples(args) else None
    model, tokenizer = load_model_from_args(args)
    calibration = describe_samples(
        samples,
        corpus,
        role="calib",
        seed=args.seed,
        spec=spec,
        context_len=args.context_len,
        continuation_len=args.continuation_len,
    )
    loader = ModelLoader(args.model, args.device, args.dtype, args.attn)
    try:
        table = collect_signals(
            model,
            samples,
            patterns=patterns,
            budgets=budgets,
            phases=phases,
            layers=args.layers,
            naive=args.naive,
            out=out,
            fresh=args.fresh,
            require_resume=args.resume,
            jobs=args.jobs,
            backend=args.backend,
            address=args.address,
            model_loader=loader,
            progress=not args.no_progress,
            provenance={
                "calibration": calibration,
                "retrieval": describe_evidence(samples, mix),
                "model_args": {"device": args.device, "dtype": args.dtype, "attn": args.attn},
            },
            batch_tokens=args.batch_tokens,
            log=lambda msg: console.print(msg, highlight=False, soft_wrap=True),
        )
    except CollectError as err:
        raise CLIError(str(err)) from None
    except KeyboardInterrupt:
        raise Interrupted(
            f"finished cells are kept in {journal_path(out)}; rerun the same command to continue"
        ) from None
    if collect_heads.head_samples(args):
        try:
            collect_heads.measure(args, table, model, tokenizer, corpus, out, samples, evidence)
        except CollectError as err:  # a --backend that cannot start (a missing package, no cluster)
            raise CLIError(str(err)) from None
    cells = table.shape[0] * table.shape[1] * table.shape[2] * table.shape[3] - len(table.missing_cells())
    t = table.provenance["timings"]
    evidence = table.provenance["retrieval"]["evidence_samples"]
    mixed = f" ({evidence} with evidence, scored on their answers)" if evidence else ""
    console.print(
        f"wrote {out}: {cells} cells, {args.samples} samples{mixed} of "
        f"{args.context_len}+{args.continuation_len} tokens, "
        f"FullKV PPL {table.full_ppl:.3f}; {t['wall_seconds_last_run']:.1f}s (view it: polykv-search show {out})",
        highlight=False,
    )
    return 0
