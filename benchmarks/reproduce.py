"""The reproduction table: every solver, baseline and ablation on the same samples, at several budgets.

Run (from the repository root)::

    python benchmarks/reproduce.py --out runs/repro                       # the README's table
    python benchmarks/reproduce.py --out runs/repro --budgets 64 --context-len 1024   # a smaller one
    python benchmarks/reproduce.py --out runs/repro --retrieval-mix 0.5     # + retrieval-aware entries
    python benchmarks/reproduce.py --out runs/repro --score-per-task       # one score run per task (resumable)
    python benchmarks/reproduce.py --out runs/repro --ablations-on proportional,ilp   # + ilp's ablations
    python benchmarks/reproduce.py --out runs/repro --dry-run              # print the steps, run nothing
    python benchmarks/reproduce.py --out runs/repro --question-aware       # results-B*-qa.json, reports of it
    python benchmarks/reproduce.py --out runs/repro --head-level           # + duo, headkv, head-level ilp
    python benchmarks/reproduce.py --out runs/repro --head-level \
        --head-patterns 'streaming_llm,snapkv,h2o,kvzip[allocation=model]'   # + KVzip's pool at head level (H24)

Steps (each reuses finished work when rerun: signals resume, strategies and results files are kept):

1. ``collect`` a calibration signal table (``--calib-*`` settings; calibration documents never meet
   the evaluation documents). With ``--retrieval-mix MIX`` (``collect --retrieval-mix``: a count, a
   fraction or a percentage of ``--calib-samples``), also a second, retrieval-aware table
   (``signals-retrieval.json``) with the same settings on the same calibration split, MIX of its
   samples carrying synthetic evidence (formats unlike ruler's; no evaluation text is used).
2. ``solve`` the uniform single-pattern strategies (``--patterns``) at every budget; the one the
   calibration signals predict to degrade least is what the *budgets-only* and the single-phase
   ablations build on (chosen on calibration data, never on evaluation scores).
3. ``solve`` at every budget: pyramid, squeeze, cake, proportional, ilp, dp, optuna and the ablations

   * ``patterns-only``: proportional's per-layer patterns, uniform budgets (``--uniform-budgets``);
   * ``budgets-only``: the best uniform pattern everywhere, proportional's per-layer budgets
     (``--fixed-pattern``);
   * ``prefill-only`` / ``decoding-only``: proportional in one phase, the best uniform pattern at
     ``floor(B)`` in the other (``--phases``, ``--default-pattern``).

   ``--ablations-on proportional,ilp`` also builds them on ilp (``ilp-patterns-only-B<B>``, ...).

   ``proportional`` itself is "both". dp reaches the same objective as ilp; it is scored only when
   its strategy differs from ilp's. With ``--retrieval-mix``, ``proportional`` and ``ilp`` are also
   solved on the retrieval-aware table (``proportional-retrieval-B<B>``, ``ilp-retrieval-B<B>``).
   With ``--head-level``, a head-level table (``signals-heads.json``, collected after step 1) gives
   ``duo``, ``headkv``, ``ilp-head`` and ``ilp-head-streaming`` at every budget
   (:mod:`reproduce_steps`).
4. ``score`` FullKV, the uniform baselines and every strategy of a budget, the retrieval-aware ones
   included, in one run (shared prefill, paired samples; a results file is reused only when it
   holds every strategy; ``--score-per-task``: one run and file per task, with the seed that task
   has in the one run; a stopped score run resumes after its last finished sample anyway), then
   ``compare --across-budgets`` into ``table.md`` (scores ± 95 % paired
   bootstrap half-widths, differences to the best uniform, gap recovered with intervals),
   ``compare.json`` and ``sweep.png`` (score vs budget with error bars, per-layer budgets and patterns).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproduce_report import prediction_lines, signals_path, solver_report, write_reports  # noqa: E402,F401
from reproduce_steps import (  # noqa: E402,F401
    ABLATABLE,
    HEAD_PATTERNS,
    METHODS,
    PENDING,
    RETRIEVAL_METHODS,
    UNIFORM,
    Step,
    collect_steps,
    head_steps,
    run_step,
    strategy_steps,
    uniform_steps,
)

from polykv_search.patterns.spec import split_specs  # noqa: E402
from strategies import Strategy  # noqa: E402


def calibration_pattern(paths: dict[str, Path]) -> str:
    """The uniform pattern the calibration signals predict to degrade least (lowest predicted 1 - cosine of
    the uniform strategy; ties alphabetical): the ablations' default pattern. Chosen on calibration data,
    never on the evaluation scores."""
    predicted = {}
    for pattern, path in paths.items():
        pred = json.loads(path.read_text())["provenance"].get("predicted") or {}
        value = pred.get("1-cosine", pred.get("dppl"))
        predicted[pattern] = float("inf") if value is None else float(value)
    return min(sorted(predicted), key=lambda q: predicted[q])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a bad ``--retrieval-mix`` exits 2 with one line, before anything runs."""
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/repro")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--budgets", default="64,128,256")
    p.add_argument("--context-len", type=int, default=2048, help="evaluation context (default 2048)")
    p.add_argument("--samples", type=int, default=16, help="evaluation samples per task (default 16)")
    p.add_argument("--suite", default="broad,ruler")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calib-samples", type=int, default=2)
    p.add_argument("--calib-context-len", type=int, default=1024)
    p.add_argument("--calib-continuation-len", type=int, default=32)
    p.add_argument(
        "--retrieval-mix",
        default=None,
        metavar="MIX",
        help="also collect a retrieval-aware table (collect --retrieval-mix MIX: a count, fraction or percentage of "
        "--calib-samples) and score proportional/ilp solved on it beside the prose-only ones (default: none)",
    )
    p.add_argument("--patterns", default=",".join(UNIFORM))
    p.add_argument("--grid", default="32,64,128,256", help="signal grid budgets")
    p.add_argument("--b-min", type=int, default=16)
    p.add_argument("--optuna-trials", type=int, default=8)
    p.add_argument(
        "--ablations-on",
        default="proportional",
        metavar="METHODS",
        help=f"the solvers the four ablations are built on, comma-separated among {', '.join(ABLATABLE)}: "
        "proportional's are named patterns-only etc., another's <method>-patterns-only (default proportional)",
    )
    p.add_argument(
        "--score-per-task",
        action="store_true",
        help="score each task of --suite in its own run and file (task shards, compared as one run): a long "
        "study can be stopped and resumed between tasks, or its tasks run on several machines",
    )
    p.add_argument("--dry-run", action="store_true", help="print the steps (polykv-search argv) and run nothing")
    p.add_argument("--question-aware", action="store_true", help="score question-aware (score --question-aware)")
    p.add_argument(
        "--head-level",
        action="store_true",
        help="also collect a head-level table and score duo, headkv, ilp-head and ilp-head-streaming (issue 25)",
    )
    p.add_argument("--head-grid", default="64,128,256", help="head-cell budgets of --head-level (default 64,128,256)")
    p.add_argument(
        "--head-patterns",
        default=HEAD_PATTERNS,
        help=f"head-cell patterns of --head-level (default {HEAD_PATTERNS}); with kvzip[allocation=model] among them "
        "ilp-head may pool heads with KVzip (the study's H24)",
    )
    args = p.parse_args(argv)
    if args.retrieval_mix is not None:
        from polykv_search.cli.common import CLIError
        from polykv_search.cli.quickstart import check_retrieval_mix

        try:
            args.retrieval_mix = check_retrieval_mix(args.retrieval_mix, args.calib_samples)
        except CLIError as err:
            p.error(str(err))
    from polykv_search.cli.collect_heads import MIN_RETRIEVAL_SAMPLES

    if args.head_level and args.calib_samples < MIN_RETRIEVAL_SAMPLES:  # its collect gives --retrieval-heads that many
        p.error(
            f"--head-level needs --calib-samples of at least {MIN_RETRIEVAL_SAMPLES} (its retrieval heads), "
            f"got {args.calib_samples}"
        )
    args.ablations_on = [m.strip() for m in args.ablations_on.split(",") if m.strip()]
    bad = [m for m in args.ablations_on if m not in ABLATABLE]
    if bad or not args.ablations_on:
        p.error(f"--ablations-on: {bad[0] if bad else 'nothing'!r} is not one of {', '.join(ABLATABLE)}")
    args.out = Path(args.out)
    args.budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    args.uniform = [q for q in split_specs(args.patterns) if q]  # also the uniform baselines; kvzip[allocation=model]
    return args


def score_steps(args: argparse.Namespace, B: str, strategies: list[Path]) -> list[Step]:
    """FullKV, the uniform baselines and ``strategies`` in one score run (paired samples); with
    ``--score-per-task``, one run per task of ``--suite`` (task shards: the task at index ``i`` gets
    seed ``--seed + i``, so each task has the samples of the one run), each written to its own file."""
    baselines = ["--baseline", "full", *[a for u in args.uniform for a in ("--baseline", f"uniform:{u}")]]
    runs = list(enumerate(_task_names(args.suite))) if args.score_per_task else [(0, args.suite)]
    steps = []
    for i, suite in runs:
        out = results_path(args, B, suite if args.score_per_task else None)
        seed = str(args.seed + i)
        evaluation = [
            "--model",
            args.model,
            "--device",
            args.device,
            "--suite",
            suite,
            "--samples",
            str(args.samples),
            "--context-len",
            str(args.context_len),
            "--seed",
            seed,
        ]
        argv = ["score", *evaluation, "--budget", B, *baselines, "--strategy", *map(str, strategies), "--out", str(out)]
        argv[-2:-2] = ["--question-aware"] if args.question_aware else []
        steps.append(Step(f"score B={B}" + (f" {suite}" if args.score_per_task else ""), argv, out))
    return steps


def _task_names(suite: str) -> list[str]:
    from polykv_search.scoring import resolve_tasks

    return [t.name for t in resolve_tasks(suite)]


def results_path(args: argparse.Namespace, B: str, task: str | None = None) -> Path:
    B += "-qa" if args.question_aware else ""  # each protocol's results beside the other's, never mixed
    return args.out / (f"results-B{B}.json" if task is None else f"results-B{B}-{task.replace('/', '-')}.json")


def all_results(args: argparse.Namespace) -> list[Path]:
    """Every results file of the study (per budget, or per budget and task with ``--score-per-task``)."""
    return [s.target for B in args.budgets for s in score_steps(args, B, [])]


def compare_step(args: argparse.Namespace) -> Step:
    results = [str(r) for r in all_results(args)]
    argv = [
        "compare",
        *results,
        "--across-budgets",
        "--plot",
        str(args.out / "sweep.png"),
        "--json",
        str(args.out / "compare.json"),
        "--signals",
        str(signals_path(args)),
    ]
    return Step("compare", argv)


def plan(args: argparse.Namespace, default: str = PENDING) -> list[Step]:
    """Every step :func:`main` runs, in order, without running any (dp is listed; :func:`main` drops it
    from the score run when it equals ilp). ``default`` stands for the ablations' calibration pattern."""
    steps = collect_steps(args)
    for B in args.budgets:
        steps += uniform_steps(args, B).values()
        solved = strategy_steps(args, B, default) | head_steps(args, B)
        steps += solved.values()
        steps += score_steps(args, B, [s.target for s in solved.values()])
    return [*steps, compare_step(args)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        for s in plan(args):
            print(f"{s.name}: polykv-search {' '.join(s.argv)}")
        return 0
    out = args.out
    if args.retrieval_mix:
        from polykv_search.cli.common import CLIError
        from polykv_search.cli.quickstart import check_table_mix

        try:
            check_table_mix(signals_path(args, True), args.retrieval_mix)
        except CLIError as err:
            raise SystemExit(f"error: {err}") from None
    (out / "strategies").mkdir(parents=True, exist_ok=True)
    log: dict = {}
    for s in collect_steps(args):
        run_step(s, log)
    results = []
    for B in args.budgets:
        uniform = {u: run_step(s, log) for u, s in uniform_steps(args, B).items()}
        default = calibration_pattern(uniform)
        print(f"ablations at B={B} use {default} (lowest predicted degradation on the calibration signals)")
        solving = strategy_steps(args, B, default) | head_steps(args, B)
        solved = {name: run_step(s, log) for name, s in solving.items()}
        if _same_strategy(solved["dp"], solved["ilp"]):
            print(f"dp == ilp at B={B}: scored once (as ilp)")
            del solved["dp"]
        # one score run per budget: FullKV, the uniform baselines and every strategy on the same samples
        # (the shared engine prefills each sample once for all of them; comparisons are paired)
        for step in score_steps(args, B, list(solved.values())):
            if not _results_cover(step.target, list(solved.values()), step.argv):
                run_step(step._replace(target=None), log)
            results.append(step.target)
    run_step(compare_step(args), log)
    write_reports(args, results, log)
    print(
        f"\ndone: {out}/ (table.md, solvers.md, compare.json, sweep.png, results-*.json, strategies/); step times {log}"
    )
    return 0


#: score flags a finished results file must have been made with to be reused, by settings key
_SAMPLE_FLAGS = {"--suite": "suite", "--samples": "samples", "--context-len": "context_len", "--seed": "seed"}


def _results_cover(path: Path, strategies: list[Path], argv: list[str] | None = None) -> bool:
    """Whether the results file exists and scored every one of ``strategies`` (paths compared resolved:
    a run given ``--out runs/x`` and one given its absolute path name the same files) on the samples
    the score ``argv`` asks for (suite, samples, context length and seed, when ``argv`` is given)."""
    try:
        doc = json.loads(path.read_text())
        sources = {str(Path(e["source"]).resolve()) for e in doc["entries"]}
        settings = doc["provenance"]["settings"] if argv else {}
        if argv and (doc["provenance"].get("protocol") == "question-aware") != ("--question-aware" in argv):
            return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    for flag, key in _SAMPLE_FLAGS.items() if argv else ():
        if flag in argv and str(settings.get(key)) != argv[argv.index(flag) + 1]:
            return False
    return {str(Path(p).resolve()) for p in strategies} <= sources


def _same_strategy(a: Path, b: Path) -> bool:
    return Strategy.load(a).digest() == Strategy.load(b).digest()


if __name__ == "__main__":
    raise SystemExit(main())
