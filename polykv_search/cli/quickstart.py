"""`polykv-search quickstart`: the whole PolyKV workflow on the embedded default, in one command.

collect a small signal grid -> every solver at one budget -> score them with the baselines on both
suites -> compare table, plots and a short markdown report, all under one output folder. Each step
reuses finished work when rerun (collect resumes from its journal; solved strategies and score
results whose settings match are kept).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from polykv_search.cli.common import CLIError, check_output_dir, comma_list, console, positive_float, positive_int

#: solvers run by quickstart (optuna with a short study)
METHODS = ("proportional", "ilp", "dp", "squeeze", "cake", "pyramid", "optuna")
BASELINES = ("full", "uniform:snapkv", "uniform:tova", "uniform:h2o", "uniform:streaming_llm")
#: evaluation samples per task: chosen so that the run stays within 15 min on 2 CPU cores (README)
EVAL_SAMPLES = 9


def add_parser(sub) -> None:
    p = sub.add_parser(
        "quickstart",
        help="collect -> solve (every method) -> score -> compare, on the default model, in one command",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="polykv-quickstart", help="output folder (default ./polykv-quickstart)")
    p.add_argument("--model", default=None, help="model (default smollm2-135m, offline)")
    p.add_argument("--budget", type=positive_float, default=64, help="global budget B (default 64)")
    p.add_argument("--calib-samples", type=positive_int, default=2)
    p.add_argument(
        "--context-len", type=positive_int, default=512, help="calibration and evaluation context (default 512)"
    )
    p.add_argument("--continuation-len", type=positive_int, default=32)
    p.add_argument(
        "--patterns",
        type=comma_list(str, "pattern"),
        default="snapkv,tova,h2o,streaming_llm",
        help="signal grid patterns (default snapkv,tova,h2o,streaming_llm)",
    )
    p.add_argument(
        "--budgets",
        type=comma_list(positive_int, "budget"),
        default="32,64,128",
        help="signal grid budgets (default 32,64,128)",
    )
    p.add_argument(
        "--eval-samples",
        type=positive_int,
        default=EVAL_SAMPLES,
        help=f"evaluation samples per task (default {EVAL_SAMPLES})",
    )
    p.add_argument(
        "--eval-context-len", type=positive_int, default=None, help="evaluation context (default: --context-len)"
    )
    p.add_argument("--suite", default="broad,ruler")
    p.add_argument(
        "--methods",
        type=comma_list(str, "method"),
        default=",".join(METHODS),
        help=f"solvers to run (default {','.join(METHODS)})",
    )
    p.add_argument("--optuna-trials", type=positive_int, default=6)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from polykv_search.cli import invoke, is_user_error
    from polykv_search.models import DEFAULT_MODEL
    from polykv_search.scoring import resolve_tasks
    from solvers import list_methods

    out = check_output_dir(args.out)
    resolve_tasks(args.suite)  # a bad suite fails now, not after the collect step
    known = {m.name for m in list_methods()}
    unknown = [m for m in args.methods if m not in known]
    if unknown:
        raise CLIError(f"--methods: unknown method {unknown[0]!r}; known: {', '.join(sorted(known))}")
    out.mkdir(parents=True, exist_ok=True)
    eval_len = args.eval_context_len or args.context_len
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
    signals = out / "signals.json"
    step(
        "1/4 collect",
        [
            "collect",
            *common,
            "--samples",
            str(args.calib_samples),
            "--context-len",
            str(args.context_len),
            "--continuation-len",
            str(args.continuation_len),
            "--patterns",
            patterns,
            "--budgets",
            budgets,
            "--out",
            str(signals),
        ],
    )

    strategies_dir = out / "strategies"
    paths = []
    for method in args.methods:
        target = strategies_dir / f"{method}-B{B}.json"
        extra = []
        if method == "optuna":
            extra = [
                "--trials",
                str(args.optuna_trials),
                "--model",
                model,
                "--study-name",
                f"quickstart-{method}-B{B}",
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
                ["solve", "--method", method, "--signals", str(signals), "--budget", B, *extra, "--out", str(target)],
            )
        paths.append(str(target))

    results = out / f"results-B{B}.json"
    settings = {"suite": args.suite, "samples": args.eval_samples, "context_len": eval_len, "budget": args.budget}
    if not _results_match(results, settings, paths):
        argv = ["score", *common, "--strategy", *paths]
        for spec in BASELINES:
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
            "--out",
            str(results),
        ]
        step("3/4 score", argv)

    step(
        "4/4 compare",
        ["compare", str(results), "--plot", str(out / "compare.png"), "--json", str(out / "compare.json")],
    )
    _write_report(out, results, timings, args)
    console.print(
        f"[green]done[/green]: everything is in {out}/ "
        f"(report.md, compare.png, strategies/, signals.json, {results.name})"
    )
    return 0


def _results_match(path: Path, settings: dict, strategy_paths: list[str]) -> bool:
    if not path.exists():
        return False
    try:
        doc = json.loads(path.read_text())
        have = doc["provenance"]["settings"]
        sources = {e["source"] for e in doc["entries"]}
    except (OSError, ValueError, KeyError):
        return False
    return all(have.get(k) == v for k, v in settings.items()) and set(strategy_paths) <= sources


def _write_report(out: Path, results: Path, timings: dict, args: argparse.Namespace) -> None:
    from polykv_search import compare as cmp
    from polykv_search.io import atomic_write_text

    doc = cmp.load_results(results)
    comparison = cmp.compare([doc], sources=[str(results)])
    settings = doc["provenance"]["settings"]
    warning = cmp.unresolved_warning(comparison)
    lines = [
        "# polykv-search quickstart",
        "",
        f"Model `{doc['provenance']['model']}`, global budget B = {args.budget:g}, evaluation context "
        f"{settings['context_len']} tokens, {settings['samples']} samples per task, suites `{args.suite}`. "
        f"Calibration: {args.calib_samples} samples of {args.context_len} + {args.continuation_len} tokens, "
        f"patterns {','.join(args.patterns)}, budgets {','.join(map(str, args.budgets))}.",
        "",
        cmp.to_markdown(comparison),
        "",
        *[f"- {note}" for note in cmp.notes(comparison)],
        "",
        f"**Not resolved:** {warning}" if warning else "Every difference to the best uniform baseline is resolved.",
        "",
        "A difference whose interval contains 0 is not a result: rerun with more `--eval-samples` to resolve it.",
        "",
        "![per-layer budgets and patterns](compare.png)",
        "",
        "Step times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()) if timings else "All steps reused.",
    ]
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
