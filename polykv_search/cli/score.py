"""`polykv-search score`: every strategy and baseline on the same samples, with the same runtime."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from polykv_search.cli.arg_types import at_most, jobs_count, positive_float, seed_value
from polykv_search.cli.common import (
    CLIError,
    Interrupted,
    add_decode_interval_args,
    add_model_args,
    add_protocol_arg,
    check_model_args,
    check_output_path,
    console,
    load_model_from_args,
    out,
)
from polykv_search.cli.limits import token_count
from polykv_search.cli.outputs import check_not_an_input
from polykv_search.cli.score_checks import (
    MAX_SAMPLES,
    check_entries,
    check_fan_out,
    check_held_budgets,
    check_limits,
    check_longbench_sources,
    sample_count,
)
from polykv_search.cli.score_resume import DECODE_BATCH, open_checkpoint
from polykv_search.progress import ProgressBar
from polykv_search.runtime.architectures import model_spec
from polykv_search.scoring.engine import MAX_BATCH_ENTRIES


def add_parser(sub) -> None:
    from polykv_search.cli.baselines import BASELINE_SPECS

    p = sub.add_parser(
        "score",
        help="score strategies and baselines on the task suites",
        description="Score strategy files and baselines on the same generated samples with the same runtime; "
        "writes a results JSON (per-task and per-suite scores, KV bytes, timing, provenance) and prints a table.",
    )
    add_model_args(p)
    p.add_argument(
        "--strategy",
        nargs="+",
        action="extend",  # --strategy a.json --strategy b.json scores both (store would keep b.json alone)
        default=[],
        metavar="S.json",
        help="strategy files to score; repeatable",
    )
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="SPEC",
        help=f"baseline to add ({BASELINE_SPECS}); repeatable",
    )
    p.add_argument("--budget", type=positive_float, help="global budget B used to build the budgeted baselines")
    p.add_argument(
        "--suite",
        default="broad,ruler",
        help="suites and/or task names, comma separated (default broad,ruler; also decode, longbench); "
        "none: lm-eval tasks only",
    )
    p.add_argument(
        "--samples", type=sample_count, default=4, help=f"samples per task (default 4; at most {MAX_SAMPLES:,})"
    )
    p.add_argument(
        "--context-len",
        type=token_count,
        default=1024,
        help="prompt length in tokens (default 1024); a strategy that would hold more tokens at this length than "
        "the budget it states (a 'full' layer or head, keep-all heads built for a shorter context) is refused, not "
        "scored with a B that misstates its memory (one that holds less, at a shorter context, is scored)",
    )
    p.add_argument("--seed", type=seed_value, default=0, help="sample generation seed (default 0)")
    p.add_argument(
        "--corpus", default="austen", help="haystack corpus spec; its evaluation split is used (default austen)"
    )
    p.add_argument(
        "--split",
        choices=["eval", "calib"],
        default="eval",
        help="the corpus split samples are drawn from (default eval; calib: calibration samples, to design and "
        "diagnose on, never to report)",
    )
    p.add_argument("--longbench-source", help="LongBench data: a local folder of jsonl files or hf:NAME")
    p.add_argument("--max-new-tokens", type=token_count, help="override the tasks' generation lengths")
    p.add_argument(
        "--generate-len",
        type=token_count,
        metavar="N",
        help="decode suite: tokens FullKV generates and every entry is teacher-forced along (default 512)",
    )
    add_decode_interval_args(p, default=1, help="decoding evicts every k steps instead of every step (default 1)")
    p.add_argument(
        "--batch-entries",
        type=at_most(MAX_BATCH_ENTRIES, "entries a batch"),
        default=16,
        metavar="N",
        help=f"entries decoded together in one batch at most (memory cap; default 16; at most {MAX_BATCH_ENTRIES:,})",
    )
    p.add_argument(
        "--decode-batch",
        type=at_most(MAX_BATCH_ENTRIES, "samples a batch"),
        default=DECODE_BATCH,
        metavar="N",
        help="decode suite: samples of one prompt length decoded together at most, FullKV a row beside the "
        "entries (memory: N x (entries + 1) rows and N trajectories' logits; same results; default 8; at most "
        f"{MAX_BATCH_ENTRIES:,})",
    )
    p.add_argument(
        "--jobs",
        type=jobs_count,
        default=1,
        help="worker processes, each a full engine scoring its share of the samples, or auto: one per CPU core "
        "(at most 4 and one per 4 GiB of available memory; 1 on an accelerator) (default 1: this process)",
    )
    p.add_argument(
        "--backend",
        choices=["loky", "dask", "ray"],
        default=None,
        help="joblib backend for --jobs (default loky: local processes; dask/ray: a cluster, local without --address)",
    )
    p.add_argument("--address", default=None, help="dask scheduler / ray cluster address (default: start a local one)")
    p.add_argument(
        "--no-shared-prefill",
        action="store_true",
        help="run every entry on every sample alone (the per-entry reference path; same results, slower)",
    )
    p.add_argument(
        "--lm-eval-tasks",
        metavar="T1,T2[:METRIC]",
        help="also run every entry through these lm-evaluation-harness tasks on the same requests (the first "
        "--samples documents of each) and fold their per-document scores into the results "
        "(suite lm-eval; needs polykv-search[lm-eval])",
    )
    p.add_argument(
        "--lm-eval-include-path", metavar="DIR", help="folder of extra lm-eval task YAMLs (lm-eval's --include_path)"
    )
    add_protocol_arg(p)
    p.add_argument("--out", help="results JSON to write")
    p.add_argument(
        "--table",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print the run's compare table at the end (default on; quickstart passes --no-table and prints the "
        "table once, after its compare step)",
    )
    p.add_argument("--list-tasks", action="store_true", help="list the tasks and suites, then exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from polykv_search import scoring
    from polykv_search.cli.baselines import baseline, check_baseline
    from polykv_search.io import write_json
    from polykv_search.models import load_tokenizer, model_fingerprint
    from polykv_search.protocol import AGNOSTIC, AWARE
    from polykv_search.scoring.checkpoint import check_partial_protocol
    from polykv_search.scoring.checkpoint_schema import read_partial
    from polykv_search.scoring.task_protocol import check_task_protocol, protocol_notes
    from strategies import Strategy

    if args.list_tasks:
        return _list_tasks()
    if not args.strategy and not args.baseline:
        raise CLIError("nothing to score: give --strategy files and/or --baseline specs")
    if not args.out:
        raise CLIError("--out is required")
    check_output_path(args.out)
    check_not_an_input(args.out, "--out", [("a --strategy file", path) for path in args.strategy])
    check_fan_out(args)
    lm_request = None
    if args.lm_eval_tasks:
        from polykv_search.integrations import lm_eval_support

        lm_eval_support.require_lm_eval()  # one line, before anything imports lm-eval
        from polykv_search.integrations import lm_eval_score

        lm_request = lm_eval_score.parse_request(
            args.lm_eval_tasks, include_path=args.lm_eval_include_path, limit=args.samples
        )
    elif args.lm_eval_include_path:
        raise CLIError("--lm-eval-include-path needs --lm-eval-tasks")
    tasks = (
        []
        if lm_request and args.suite == "none"
        else scoring.resolve_tasks(args.suite, args.longbench_source, args.generate_len)
    )
    protocol = AWARE if args.question_aware else AGNOSTIC
    for task in tasks:
        check_task_protocol(task, protocol)
    check_longbench_sources(tasks)
    for note in protocol_notes(tasks, protocol):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    for spec in args.baseline:
        check_baseline(spec, args.budget)
    strategies = [(path, Strategy.load(path)) for path in args.strategy]
    check_held_budgets(strategies, args.context_len)
    check_entries(args, strategies)
    shape = {"entries": len(strategies) + len(args.baseline), "kinds": {t.name: t.kind for t in tasks}}
    found = read_partial(f"{args.out}.partial", **shape)  # a checkpoint it cannot use is refused before the model loads
    if found.key is not None:
        check_partial_protocol(f"{args.out}.partial", found.protocol, protocol)
    check_model_args(args)
    check_limits(args, tasks)
    with console.status(f"reading the corpus {args.corpus} ..."):
        texts, split = (
            scoring.eval_texts(args.corpus, args.split) if tasks else ([], {})
        )  # a bad --corpus: before the model
    with console.status("generating samples ..."):  # tokens only: a --context-len too short, before the model
        tok = load_tokenizer(args.model)
        task_samples = scoring.make_task_samples(
            tok, tasks, texts, n_samples=args.samples, context_len=args.context_len, seed=args.seed, role=args.split
        )
    model, tok = load_model_from_args(args)
    check_limits(args, tasks, model.config.to_dict())  # a hub model whose config was not at hand before
    L = model.config.get_text_config(decoder=True).num_hidden_layers
    entries = [scoring.Entry(Path(p).stem, s, "strategy", p) for p, s in strategies]
    for s in entries:
        s.strategy.check_model(L, model_spec(model).num_kv_heads)
    entries += [baseline(spec, L, args.budget) for spec in args.baseline]  # their names: check_entries
    engine = "per-entry" if args.no_shared_prefill else "shared"
    settings = {
        "suite": args.suite,
        "samples": args.samples,
        "context_len": args.context_len,
        "seed": args.seed,
        "budget": args.budget,
        "corpus": args.corpus,
        "decode_interval": args.decode_interval,
        "interval_mode": args.interval_mode,
        "max_new_tokens": args.max_new_tokens,
        "generate_len": args.generate_len,
        "device": args.device,
        "dtype": args.dtype,
        "attn": args.attn,
        "batch_entries": args.batch_entries,
        "decode_batch": args.decode_batch,
    }
    fingerprint = model_fingerprint(model)
    checkpoint = open_checkpoint(args.out, settings, engine, fingerprint, entries, task_samples, shape, protocol)
    total = len(entries) * sum(len(s) for _, s in task_samples.values())
    costs = scoring.run_costs(task_samples, context_len=args.context_len, max_new_tokens=args.max_new_tokens)
    timing: dict[str, float] = {}
    try:
        done = len(checkpoint.done) * len(entries)
        bar = ProgressBar(
            console,
            f"scoring {len(entries)} entries ({engine})",
            total,
            completed=done,
            unit="entry×samples",
            work_total=sum(costs.values()),
            work_done=sum(costs.get(key, 0.0) for key in checkpoint.done),
        )
        with bar:
            records = scoring.score_entries(
                model,
                tok,
                entries,
                task_samples,
                engine=engine,
                batch_entries=args.batch_entries,
                decode_interval=args.decode_interval,
                interval_mode=args.interval_mode,
                max_new_tokens=args.max_new_tokens,
                progress=bar.advance,
                timing=timing,
                checkpoint=checkpoint,
                work=costs,
                fan_out=_fan_out(args),
                protocol=protocol,
                decode_batch=args.decode_batch,
            )
    except KeyboardInterrupt:  # one line: where the finished samples are
        raise Interrupted(
            f"{checkpoint.kept()} finished samples kept in {checkpoint.path}; the same command resumes from there"
        ) from None
    if lm_request is not None:
        lm_runs = lm_eval_score.run_entries(
            model, tok, entries, lm_request, decode_interval=args.decode_interval, console=console
        )
    doc = scoring.results_document(
        records,
        model_name=args.model,
        model_fp=fingerprint,
        task_samples=task_samples,
        settings=settings,
        split=split,
        engine=engine,
        timing=timing,
        protocol=protocol,
        execution=_execution(args),
    )
    if lm_request is not None:
        lm_eval_score.fold(doc, lm_runs, lm_request)
    write_json(args.out, doc)
    checkpoint.remove()
    if args.table:
        print_results(doc)
    console.print(f"wrote {args.out}")
    return 0


def _fan_out(args: argparse.Namespace):
    """The samples' fan-out for ``--jobs``/``--backend`` (None: this process alone)."""
    if args.jobs == 1 and not args.backend:
        return None
    from polykv_search.parallel import ModelLoader
    from polykv_search.scoring.parallel import FanOut

    return FanOut(ModelLoader(args.model, args.device, args.dtype, args.attn), args.jobs, args.backend, args.address)


def _execution(args: argparse.Namespace) -> dict:
    """How the run was executed (provenance only: jobs, backend and threads never change a score)."""
    import torch

    from polykv_search.parallel import worker_threads

    if args.jobs == 1 and not args.backend:
        return {"jobs": 1, "backend": "in-process", "threads": torch.get_num_threads()}
    threads = torch.get_num_threads() if args.backend == "sequential" else worker_threads(args.backend, args.jobs)
    return {"jobs": args.jobs, "backend": args.backend or "loky", "threads": threads}


def print_results(doc: dict) -> None:
    """The compare table of this run (scores with 95 % paired intervals; fits 80 columns), and one
    warning line when differences to the best uniform baseline are inside their intervals."""
    from polykv_search import compare as cmp

    comparison = cmp.compare([doc], across_budgets=True)
    out.print(cmp.summary_table(comparison))
    warning = cmp.unresolved_warning(comparison)
    if warning:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)


def _list_tasks() -> int:
    from polykv_search.evaluation import list_tasks

    # the suite is the task name's prefix; the metric goes under the description, so that the text
    # column keeps most of a narrow terminal's width
    table = Table(title="tasks (default: run when its suite is named)", title_justify="left")
    table.add_column("task", no_wrap=True)
    table.add_column("default", no_wrap=True)
    table.add_column("description, metric", ratio=1)
    for row in list_tasks():
        text = f"{row['description']}\n[dim]metric: {row['metric']}[/dim]"
        table.add_row(row["name"], "yes" if row["default"] else "", text)
    out.print(table)
    return 0
