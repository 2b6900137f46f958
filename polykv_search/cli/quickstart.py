"""`polykv-search quickstart`: the whole PolyKV workflow on the embedded default, in one command.

collect a small signal grid -> three solvers at one budget (the paper's proportional rule, ilp and
PyramidKV's schedule) -> score them with FullKV, two uniform baselines and the head-level ilp on both
suites -> compare: the recommendation (the strategy to use and its export command, by the rule of
``compare --help``), the table once, plots and a short markdown report, all under one output folder.
``--full`` runs the full entry set of earlier runs instead (every solver, the 2023-24 uniforms too;
docs/quickstart.md says what it adds). Each step reuses finished work when rerun (collect resumes from
its journal; solved strategies and score results whose settings match are kept).

``--retrieval-mix MIX`` (as ``collect --retrieval-mix``: a count, a fraction or a percentage of
``--calib-samples``) makes the calibration retrieval-aware; its signal table and strategies are
written beside the prose-only ones (``signals-retrieval.json``, ``strategies/*-retrieval-B*.json``).
The default, prose-only calibration, is unchanged. The report states which calibration was used.

``--head-level`` (on by default) also collects a small per-KV-head table (``signals-heads.json``) and
scores the head-level ilp (``strategies/ilp-head-B<B>.json``: per KV head, keep every token or one
(pattern, budget) cell; the heads given ``kvzip[allocation=model]`` share one KVzip pool), the kind of
strategy that keeps ruler's needles; ``--no-head-level`` skips it.

The baselines (``--baselines``) include KVzip's own allocation, ``uniform:kvzip[allocation=model]``, the
best uniform on ruler in the studies (studies/results.md): the verdict compares with the best uniform scored.

``--jobs`` (default ``auto``: one worker process per CPU core, at most 4 and one per 4 GiB of available
memory, one thread each; 1 on an accelerator) runs collect and score as their ``--jobs`` do; the results
do not depend on it.

``--question-aware`` scores under the question-aware protocol (``score --question-aware``) into
``results-B<B>-question-aware.json``, beside the default question-agnostic results; with
``--retrieval-mix`` the evidence samples' query sits inside the compressed prompt too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from polykv_search.cli import quickstart_defaults as D
from polykv_search.cli import quickstart_heads as H
from polykv_search.cli.arg_types import at_most, comma_list, jobs_count, pattern_specs, positive_float, positive_int
from polykv_search.cli.collect import calibration_count
from polykv_search.cli.common import (
    CLIError,
    ParagraphHelpFormatter,
    add_protocol_arg,
    check_output_dir,
    console,
    resolve_jobs,
)
from polykv_search.cli.limits import token_count
from polykv_search.cli.quickstart_report import write_report
from polykv_search.cli.score_checks import check_limits, sample_count
from polykv_search.protocol import AGNOSTIC, AWARE, protocol_of
from solvers.optuna_settings import MAX_TRIALS

#: the defaults, chosen by measurement (quickstart_defaults.py, docs/quickstart.md)
METHODS, BASELINES, EVAL_SAMPLES = D.METHODS, D.BASELINES, D.EVAL_SAMPLES
FULL_METHODS, FULL_BASELINES, FULL_EVAL_SAMPLES = D.FULL_METHODS, D.FULL_BASELINES, D.FULL_EVAL_SAMPLES


def add_parser(sub) -> None:
    from polykv_search.patterns.spec import split_specs

    p = sub.add_parser(
        "quickstart",
        help="collect -> solve -> score -> compare on the default model, ending with the strategy to use",
        description=__doc__,
        formatter_class=ParagraphHelpFormatter,
    )
    p.add_argument("--out", default="polykv-quickstart", help="output folder (default ./polykv-quickstart)")
    p.add_argument("--model", default=None, help="model (default smollm2-135m, offline)")
    p.add_argument("--budget", type=positive_float, default=D.BUDGET, help=f"global budget B (default {D.BUDGET})")
    p.add_argument("--calib-samples", type=calibration_count, default=D.CALIB_SAMPLES, help="collect's --samples")
    p.add_argument(
        "--context-len",
        type=token_count,
        default=D.CONTEXT_LEN,
        help=f"calibration and evaluation context (default {D.CONTEXT_LEN})",
    )
    p.add_argument("--continuation-len", type=token_count, default=D.CONTINUATION_LEN, help="collect's")
    p.add_argument(
        "--retrieval-mix",
        default="0",
        metavar="MIX",
        help="retrieval-aware calibration, as collect's: how many of the --calib-samples carry synthetic evidence; "
        "a count (1), a fraction (0.5) or a percentage (50%%) (default 0: prose only)",
    )
    p.add_argument(
        "--patterns",
        type=pattern_specs(),
        default="snapkv,tova,h2o,streaming_llm",
        help="signal grid patterns (default snapkv,tova,h2o,streaming_llm)",
    )
    p.add_argument(
        "--budgets",
        type=comma_list(positive_int, "budget"),
        default=D.GRID_BUDGETS,
        help=f"signal grid budgets (default {D.GRID_BUDGETS})",
    )
    p.add_argument(
        "--eval-samples",
        type=sample_count,
        default=None,
        help=f"evaluation samples per task (default {EVAL_SAMPLES}; with --full {FULL_EVAL_SAMPLES})",
    )
    p.add_argument(
        "--eval-context-len", type=token_count, default=None, help="evaluation context (default: --context-len)"
    )
    p.add_argument("--suite", default="broad,ruler", help="score's --suite (default broad,ruler)")
    p.add_argument(
        "--baselines",
        type=comma_list(str, "baseline", split=split_specs),
        default=None,
        help=f"baselines scored beside the strategies, as score's --baseline (default {BASELINES}; --full adds "
        "uniform:snapkv, uniform:tova and uniform:streaming_llm)",
    )
    add_protocol_arg(
        p,
        "score under the question-aware protocol (context and question compressed together; see `score "
        "--question-aware`) into results-B<B>-question-aware.json; with --retrieval-mix the evidence samples' "
        "query sits inside the compressed prompt too (signals-retrieval-question-aware.json)",
    )
    p.add_argument(
        "--methods",
        type=comma_list(str, "method"),
        default=None,
        help=f"solvers to run (default {','.join(METHODS)}; with --full {', '.join(FULL_METHODS)})",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="the full entry set of earlier runs: every solver and the 2023-24 uniforms too, at 9 samples per task "
        "(the defaults of --methods, --baselines and --eval-samples above; docs/quickstart.md says what each adds)",
    )
    H.add_args(p)
    trials = at_most(MAX_TRIALS, "trials")  # refused before collect runs, not by optuna after it
    p.add_argument("--optuna-trials", type=trials, default=D.OPTUNA_TRIALS, help="optuna's --trials")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    p.add_argument(
        "--jobs",
        type=jobs_count,
        default="auto",
        help="worker processes for collect and score, as their --jobs (default auto: one per CPU core, "
        "at most 4 and one per 4 GiB of available memory; 1 on an accelerator)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from polykv_search.cli import build_parser, invoke, is_user_error
    from polykv_search.cli.baselines import check_baseline
    from polykv_search.cli.collect import check as collect_check
    from polykv_search.models import DEFAULT_MODEL
    from polykv_search.scoring import ScoreError, resolve_tasks
    from polykv_search.scoring.task_protocol import check_task_protocol
    from solvers import list_methods

    # every argument is checked before the output folder is made or any step runs
    args.methods, args.baselines = planned_entries(args)
    args.eval_samples = args.eval_samples or (FULL_EVAL_SAMPLES if args.full else EVAL_SAMPLES)
    out = check_output_dir(args.out)
    mix = check_retrieval_mix(args.retrieval_mix, args.calib_samples)
    qa = "-question-aware" if args.question_aware else ""  # each protocol's files sit beside the other's
    tag = f"-retrieval{qa}" if mix else ""  # the retrieval-aware files sit beside the prose-only ones
    for task in resolve_tasks(args.suite):  # a bad suite fails now, not after the collect step
        check_task_protocol(task, AWARE if args.question_aware else AGNOSTIC)
    for spec in args.baselines:
        try:
            check_baseline(spec, args.budget)
        except ScoreError as err:
            raise CLIError(f"--baselines: {err}") from None
    known = {m.name for m in list_methods()}
    unknown = [m for m in args.methods if m not in known]
    if unknown:
        raise CLIError(f"--methods: unknown method {unknown[0]!r}; known: {', '.join(sorted(known))}")
    H.check_head_methods(args.methods, args.head_level)
    eval_len = args.eval_context_len or args.context_len
    jobs = resolve_jobs(args)
    fan_out = ["--jobs", str(jobs)] if jobs > 1 else []  # local processes, one thread each on a CPU
    model = args.model or DEFAULT_MODEL
    B = f"{args.budget:g}"
    patterns, budgets = ",".join(args.patterns), ",".join(map(str, args.budgets))
    timings: dict[str, float] = {}

    def step(name: str, argv: list[str]) -> None:
        console.rule(f"[bold]{name}")
        t0 = time.perf_counter()
        try:
            invoke(argv)
        except Exception as err:  # the step's own one-line error, with the step named
            if is_user_error(err):
                raise CLIError(f"quickstart step '{name}': {err}") from None
            raise
        timings[name] = time.perf_counter() - t0

    common = ["--model", model, "--device", args.device]
    signals = out / f"signals{tag}.json"
    if mix:
        check_table_mix(signals, mix)
    calibration = [
        "collect",
        *common,
        "--samples",
        str(args.calib_samples),
        "--context-len",
        str(args.context_len),
        "--continuation-len",
        str(args.continuation_len),
    ]
    collect_argv = [
        *calibration,
        "--patterns",
        patterns,
        "--budgets",
        budgets,
        *(["--retrieval-mix", mix] if mix else []),
        *(["--question-aware"] if mix and qa else []),
        *fan_out,
        "--out",
        str(signals),
    ]
    collect_check(build_parser().parse_args(collect_argv))  # --model, --device, --patterns, --budgets, lengths
    score_args = build_parser().parse_args(["score", *common, "--context-len", str(eval_len), *fan_out, "--out", "-"])
    flag = "--eval-context-len {}" if args.eval_context_len else "--context-len {}"
    check_limits(score_args, resolve_tasks(args.suite), context_flag=flag)  # the evaluation's, before collect runs
    heads = out / H.HEADS_TABLE
    if args.head_level:
        H.check_head_level(args.calib_samples, args.head_cells, args.context_len)
        cells, head_patterns = ",".join(map(str, args.head_cells)), ",".join(args.head_patterns)
        # in this process: fanned out over one-thread workers its cells took longer on 2 cores (docs/quickstart.md)
        heads_argv = H.head_collect_argv(calibration, args.calib_samples, cells, head_patterns, heads)
        collect_check(build_parser().parse_args(heads_argv))  # the cells' budgets and patterns
    out.mkdir(parents=True, exist_ok=True)
    if args.head_level:  # first: its evidence samples' length check fails fast, before the longer collect
        step("1/4 collect heads", heads_argv)
    step("1/4 collect", collect_argv)

    strategies_dir = out / "strategies"
    paths = []
    for method in args.methods:
        target = strategies_dir / f"{method}{tag}-B{B}.json"
        extra = []
        if method == "optuna":
            extra = [
                "--trials",
                str(args.optuna_trials),
                "--model",
                model,
                "--study-name",
                f"quickstart-{method}{tag}-B{B}",
                "--storage",
                str(out / "optuna.journal"),
                "--samples",
                "1",
                "--context-len",
                str(args.context_len),
            ]
        if not target.exists():
            step(
                f"2/4 solve {method}",
                [
                    "solve",
                    "--method",
                    method,
                    *H.method_solve_args(method, signals, heads, eval_len),
                    "--budget",
                    B,
                    *extra,
                    "--out",
                    str(target),
                ],
            )
        paths.append(str(target))
    if args.head_level:
        target = strategies_dir / f"{H.HEAD_STRATEGY}-B{B}.json"
        if not target.exists():
            step(f"2/4 solve {H.HEAD_STRATEGY}", H.head_solve_argv(heads, B, eval_len, target))
        paths.append(str(target))

    results = out / f"results-B{B}{qa}.json"
    settings = {"suite": args.suite, "samples": args.eval_samples, "context_len": eval_len, "budget": args.budget}
    if not _results_match(results, settings, paths + args.baselines, AWARE if qa else AGNOSTIC):
        argv = ["score", *common, "--strategy", *paths]
        for spec in args.baselines:
            argv += ["--baseline", spec]
        argv += [
            "--budget",
            B,
            "--suite",
            args.suite,
            "--samples",
            str(args.eval_samples),
            "--context-len",
            str(eval_len),
            *(["--question-aware"] if qa else []),
            *fan_out,
            "--no-table",  # the table is printed once, by the compare step
            "--out",
            str(results),
        ]
        step("3/4 score", argv)

    step(
        "4/4 compare",
        ["compare", str(results), "--plot", str(out / "compare.png"), "--json", str(out / "compare.json")],
    )
    write_report(out, results, timings, args, calibration_summary(signals), signals)
    console.print(
        f"[green]done[/green]: everything is in {out}/ "
        f"(report.md, compare.png, strategies/, {signals.name}, {results.name})"
    )
    return 0


def planned_entries(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """``(methods, baselines)``: those given, else the defaults, or with ``--full`` the full set of earlier runs."""
    from polykv_search.patterns.spec import split_specs

    methods = args.methods or list(FULL_METHODS if args.full else METHODS)
    baselines = args.baselines or split_specs(FULL_BASELINES if args.full else BASELINES)
    return methods, baselines


def check_retrieval_mix(spec: str, n_samples: int) -> str | None:
    """``--retrieval-mix`` checked as ``collect`` checks it, before any step runs.

    Returns
    -------
    str or None
        The spec to pass on to ``collect``, or None for prose only (``0``).

    Raises
    ------
    CLIError
        One line naming ``--retrieval-mix`` (bad syntax, more evidence samples than
        ``--calib-samples``, a fraction that rounds to none).
    """
    from polykv_search.data import DataError
    from polykv_search.data.evidence import parse_retrieval_mix

    try:
        mix = parse_retrieval_mix(spec)
        if mix is not None:
            mix.evidence_samples(n_samples)
    except DataError as err:
        raise CLIError(str(err).replace("retrieval mix", "--retrieval-mix", 1)) from None
    return None if mix is None else mix.spec


def check_table_mix(path: Path, spec: str) -> None:
    """Refuse to reuse a retrieval-aware table (and the strategies solved on it) of another mix."""
    try:
        have = json.loads(path.read_text())["provenance"]["retrieval"]["mix"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if have != spec:
        raise CLIError(
            f"{path} was collected with --retrieval-mix {have}, not {spec}; "
            "give another --out (or remove it and the *-retrieval-B*.json strategies)"
        )


def _results_match(path: Path, settings: dict, sources: list[str], protocol: str = AGNOSTIC) -> bool:
    """True when ``path`` holds score results of these settings and protocol with every entry of ``sources``
    (strategy paths and baseline specs), on at least ``settings["samples"]`` samples per task (e.g. a ``--full``
    run's 9: a default run then shows them rather than scoring its 7 over them)."""
    if not path.exists():
        return False
    try:
        doc = json.loads(path.read_text())
        have = doc["provenance"]["settings"]
        have_sources = {e["source"] for e in doc["entries"]}
        same_protocol = protocol_of(doc["provenance"]) == protocol
    except (OSError, ValueError, KeyError, AttributeError):
        return False
    enough = isinstance(have.get("samples"), int) and have["samples"] >= settings["samples"]
    same = all(have.get(k) == v for k, v in settings.items() if k != "samples")
    return same_protocol and enough and same and set(sources) <= have_sources


def calibration_summary(signals: Path) -> str:
    """The report's words for the calibration's retrieval mix, read from the signal table's provenance."""
    from polykv_search.cli.show_signals import describe_retrieval
    from signals import SignalTable

    try:
        table = SignalTable.load(signals)
        lines = describe_retrieval(table.retrieval, table.n_samples)
    except Exception:  # noqa: BLE001 - the report still gets written; the table's problem shows elsewhere
        lines = ["retrieval mix: unknown (the signal table cannot be read)"]
    text = " ".join(line.strip() for line in lines)
    return text[:1].upper() + text[1:] + "."
