"""The reproduction table: every solver, baseline and ablation on the same samples, at several budgets.

Run (from the repository root)::

    python benchmarks/reproduce.py --out runs/repro                       # the README's table
    python benchmarks/reproduce.py --out runs/repro --budgets 64 --context-len 1024   # a smaller one

Steps (each reuses finished work when rerun: signals resume, strategies and results files are kept):

1. ``collect`` a calibration signal table (``--calib-*`` settings; calibration documents never meet
   the evaluation documents).
2. ``solve`` the uniform single-pattern strategies (``--patterns``) at every budget; the one the
   calibration signals predict to degrade least is what the *budgets-only* and the single-phase
   ablations build on (chosen on calibration data, never on evaluation scores).
3. ``solve`` at every budget: pyramid, squeeze, cake, proportional, ilp, dp, optuna and the ablations

   * ``patterns-only``: proportional's per-layer patterns, uniform budgets (``--uniform-budgets``);
   * ``budgets-only``: the best uniform pattern everywhere, proportional's per-layer budgets
     (``--fixed-pattern``);
   * ``prefill-only`` / ``decoding-only``: proportional in one phase, the best uniform pattern at
     ``floor(B)`` in the other (``--phases``, ``--default-pattern``).

   ``proportional`` itself is "both". dp reaches the same objective as ilp; it is scored only when
   its strategy differs from ilp's.
4. ``score`` FullKV, the uniform baselines and every strategy of a budget in one run (shared prefill,
   paired samples), then ``compare --across-budgets`` into ``table.md`` (scores ± 95 % paired
   bootstrap half-widths, differences to the best uniform, gap recovered with intervals),
   ``compare.json`` and ``sweep.png`` (score vs budget with error bars, per-layer budgets and patterns).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polykv_search.cli import main as cli  # noqa: E402
from polykv_search.compare import compare, load_results, notes, to_markdown  # noqa: E402
from polykv_search.io import atomic_write_text  # noqa: E402
from strategies import Strategy  # noqa: E402

UNIFORM = ("snapkv", "tova", "h2o", "streaming_llm")
METHODS = ("pyramid", "squeeze", "cake", "proportional", "ilp", "dp", "optuna")


def step(name: str, argv: list[str], log: dict) -> None:
    print(f"\n=== {name}: polykv-search {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    rc = cli(argv)
    log[name] = round(time.perf_counter() - t0, 1)
    if rc != 0:
        raise SystemExit(f"step {name!r} failed (exit {rc})")


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    p.add_argument("--patterns", default=",".join(UNIFORM))
    p.add_argument("--grid", default="32,64,128,256", help="signal grid budgets")
    p.add_argument("--b-min", type=int, default=16)
    p.add_argument("--optuna-trials", type=int, default=8)
    args = p.parse_args(argv)

    out = Path(args.out)
    (out / "strategies").mkdir(parents=True, exist_ok=True)
    log: dict = {}
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    patterns = [q.strip() for q in args.patterns.split(",") if q.strip()]  # also the uniform baselines
    evaluation = [
        "--model",
        args.model,
        "--device",
        args.device,
        "--suite",
        args.suite,
        "--samples",
        str(args.samples),
        "--context-len",
        str(args.context_len),
        "--seed",
        str(args.seed),
    ]
    signals = out / "signals.json"
    step(
        "collect",
        [
            "collect",
            "--model",
            args.model,
            "--device",
            args.device,
            "--samples",
            str(args.calib_samples),
            "--context-len",
            str(args.calib_context_len),
            "--continuation-len",
            str(args.calib_continuation_len),
            "--patterns",
            args.patterns,
            "--budgets",
            args.grid,
            "--out",
            str(signals),
        ],
        log,
    )
    results = []
    for B in budgets:

        def solve(name: str, solver_args: list[str], extra: list[str] = ()) -> Path:
            target = out / "strategies" / f"{name}-B{B}.json"
            if not target.exists():
                step(
                    f"solve {name} B={B}",
                    [
                        "solve",
                        *solver_args,
                        "--signals",
                        str(signals),
                        "--budget",
                        B,
                        "--b-min",
                        str(args.b_min),
                        *extra,
                        "--out",
                        str(target),
                    ],
                    log,
                )
            return target

        uniform = {u: solve(f"uniform-{u}", ["--method", "uniform", "--pattern", u]) for u in patterns}
        default = calibration_pattern(uniform)
        print(f"ablations at B={B} use {default} (lowest predicted degradation on the calibration signals)")
        runs = {m: ["--method", m] for m in METHODS}
        runs["patterns-only"] = ["--method", "proportional", "--uniform-budgets"]
        runs["budgets-only"] = ["--method", "proportional", "--fixed-pattern", default]
        runs["prefill-only"] = ["--method", "proportional", "--phases", "prefill", "--default-pattern", default]
        runs["decoding-only"] = ["--method", "proportional", "--phases", "decoding", "--default-pattern", default]
        optuna = [
            "--model",
            args.model,
            "--device",
            args.device,
            "--trials",
            str(args.optuna_trials),
            "--storage",
            str(out / "optuna.journal"),
            "--study-name",
            f"repro-B{B}",
            "--samples",
            "1",
            "--context-len",
            str(args.calib_context_len),
        ]
        solved = {
            name: solve(name, solver_args, optuna if name == "optuna" else []) for name, solver_args in runs.items()
        }
        if _same_strategy(solved["dp"], solved["ilp"]):
            print(f"dp == ilp at B={B}: scored once (as ilp)")
            del solved["dp"]
        # one score run per budget: FullKV, the uniform baselines and every strategy on the same samples
        # (the shared engine prefills each sample once for all of them; comparisons are paired)
        scored = out / f"results-B{B}.json"
        if not scored.exists():
            baselines = ["--baseline", "full", *[a for u in patterns for a in ("--baseline", f"uniform:{u}")]]
            step(
                f"score B={B}",
                [
                    "score",
                    *evaluation,
                    "--budget",
                    B,
                    *baselines,
                    "--strategy",
                    *map(str, solved.values()),
                    "--out",
                    str(scored),
                ],
                log,
            )
        results.append(scored)
    step(
        "compare",
        [
            "compare",
            *map(str, results),
            "--across-budgets",
            "--plot",
            str(out / "sweep.png"),
            "--json",
            str(out / "compare.json"),
        ],
        log,
    )
    comparison = compare([load_results(r) for r in results], sources=[str(r) for r in results], across_budgets=True)
    lines = [
        f"{args.samples} samples per task, {args.context_len}-token contexts, seed {args.seed}; "
        "score ± half-width of the 95 % paired bootstrap interval.",
        "",
        to_markdown(comparison),
        "",
        *[f"- {n}" for n in notes(comparison)],
    ]
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "solvers.md", solver_report(out) + "\n")
    atomic_write_text(out / "timings.json", json.dumps(log, indent=2) + "\n")
    print(
        f"\ndone: {out}/ (table.md, solvers.md, compare.json, sweep.png, results-*.json, strategies/); step times {log}"
    )
    return 0


def solver_report(out: Path) -> str:
    """Markdown: per budget and scored strategy, the table's predicted degradation (from the
    strategy's provenance) beside the measured suite scores (± 95 % half-width) and gap recovered
    (with its interval) from compare.json."""
    rows = json.loads((out / "compare.json").read_text())["rows"]
    suites = sorted({s for r in rows for s in r["suites"]})
    head = ["strategy", "B", "pred. ΔPPL", "pred. 1−cos", "pred. KL"] + suites + [f"gap {s}" for s in suites]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    for r in sorted((r for r in rows if r["kind"] == "strategy"), key=lambda r: (r["budget"], r["name"])):
        path = out / "strategies" / f"{r['name']}.json"
        predicted = json.loads(path.read_text())["provenance"].get("predicted", {}) if path.exists() else {}
        name = " = ".join([r["name"], *r.get("aliases", [])])  # identical strategies are merged by compare
        cells = [
            name,
            f"{r['budget']:g}",
            fmt(predicted.get("dppl"), ".3g"),
            fmt(predicted.get("1-cosine"), ".3g"),
            fmt(predicted.get("kl"), ".3g"),
        ]
        intervals = (r.get("intervals") or {}).get("suites", {})
        for suite in suites:
            hw = (intervals.get(suite) or {}).get("half_width")
            cells.append(fmt(r["suites"].get(suite), ".1f") + ("" if hw is None else f" ± {hw:.1f}"))
        for suite in suites:
            gap = (r.get("gap_recovered_interval") or {}).get(suite) or {}
            ci = gap.get("interval")
            if ci and ci.get("low") is not None and ci.get("high") is not None:
                cells.append(f"{100 * ci['estimate']:.0f}% [{100 * ci['low']:.0f}, {100 * ci['high']:.0f}]")
            else:
                cells.append("n/a" + (f" ({gap['reason']})" if gap.get("reason") else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _same_strategy(a: Path, b: Path) -> bool:
    return Strategy.load(a).digest() == Strategy.load(b).digest()


if __name__ == "__main__":
    raise SystemExit(main())
