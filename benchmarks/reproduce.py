"""The reproduction table: every solver, baseline and ablation on the same samples, at several budgets.

Run (from the repository root)::

    python benchmarks/reproduce.py --out runs/repro                       # the README's table
    python benchmarks/reproduce.py --out runs/repro --budgets 64 --context-len 1024   # a smaller one

Steps (each reuses finished work when rerun: signals resume, strategies and results files are kept):

1. ``collect`` a calibration signal table (``--calib-*`` settings; calibration documents never meet
   the evaluation documents).
2. ``score`` FullKV (once) and the uniform single-pattern baselines (``--patterns``) at every budget; the best uniform
   pattern per budget (mean of the suite scores) is what the *budgets-only* and the single-phase
   ablations build on.
3. ``solve`` at every budget: pyramid, squeeze, cake, proportional, ilp, dp, optuna and the ablations

   * ``patterns-only``: proportional's per-layer patterns, uniform budgets (``--uniform-budgets``);
   * ``budgets-only``: the best uniform pattern everywhere, proportional's per-layer budgets
     (``--fixed-pattern``);
   * ``prefill-only`` / ``decoding-only``: proportional in one phase, the best uniform pattern at
     ``floor(B)`` in the other (``--phases``, ``--default-pattern``).

   ``proportional`` itself is "both". dp reaches the same objective as ilp; it is scored only when
   its strategy differs from ilp's.
4. ``score`` the strategies per budget, then ``compare --across-budgets`` into ``table.md``,
   ``compare.json`` and ``sweep.png`` (score vs budget, per-layer budgets and patterns).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polykv_search.cli import main as cli  # noqa: E402
from polykv_search.compare import compare, load_results, to_markdown  # noqa: E402
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


def best_uniform_pattern(results: Path) -> str:
    """The uniform baseline with the best mean suite score (ties: alphabetical)."""
    doc = json.loads(results.read_text())
    scored = {
        e["name"].removeprefix("uniform-"): sum(e["suites"].values()) / len(e["suites"])
        for e in doc["entries"]
        if e["name"].startswith("uniform-")
    }
    return max(sorted(scored), key=lambda p: scored[p])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/repro")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--budgets", default="64,128,256")
    p.add_argument("--context-len", type=int, default=2048, help="evaluation context (default 2048)")
    p.add_argument("--samples", type=int, default=1, help="evaluation samples per task (default 1)")
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
    evaluation = ["--model", args.model, "--device", args.device, "--suite", args.suite, "--samples", str(args.samples),
                  "--context-len", str(args.context_len), "--seed", str(args.seed)]
    signals = out / "signals.json"
    step("collect", ["collect", "--model", args.model, "--device", args.device, "--samples", str(args.calib_samples),
                     "--context-len", str(args.calib_context_len), "--continuation-len", str(args.calib_continuation_len),
                     "--patterns", args.patterns, "--budgets", args.grid, "--out", str(signals)], log)
    full = out / "results-full.json"
    if not full.exists():
        step("score full", ["score", *evaluation, "--baseline", "full", "--out", str(full)], log)
    results = [full]
    for B in budgets:
        base = out / f"results-B{B}-uniform.json"
        if not base.exists():
            step(f"score uniform B={B}", ["score", *evaluation, "--budget", B,
                                          *[a for u in patterns for a in ("--baseline", f"uniform:{u}")], "--out", str(base)], log)
        best = best_uniform_pattern(base)
        print(f"best uniform pattern at B={B}: {best}")
        solved: dict[str, Path] = {}
        runs = {m: ["--method", m] for m in METHODS}
        runs["patterns-only"] = ["--method", "proportional", "--uniform-budgets"]
        runs["budgets-only"] = ["--method", "proportional", "--fixed-pattern", best]
        runs["prefill-only"] = ["--method", "proportional", "--phases", "prefill", "--default-pattern", best]
        runs["decoding-only"] = ["--method", "proportional", "--phases", "decoding", "--default-pattern", best]
        for name, solver_args in runs.items():
            target = out / "strategies" / f"{name}-B{B}.json"
            extra = []
            if name == "optuna":
                extra = ["--model", args.model, "--device", args.device, "--trials", str(args.optuna_trials), "--storage", str(out / "optuna.journal"),
                         "--study-name", f"repro-B{B}", "--samples", "1", "--context-len", str(args.calib_context_len)]
            if not target.exists():
                step(f"solve {name} B={B}", ["solve", *solver_args, "--signals", str(signals), "--budget", B,
                                             "--b-min", str(args.b_min), *extra, "--out", str(target)], log)
            solved[name] = target
        if _same_strategy(solved["dp"], solved["ilp"]):
            print(f"dp == ilp at B={B}: scored once (as ilp)")
            del solved["dp"]
        scored = out / f"results-B{B}-strategies.json"
        if not scored.exists():
            step(f"score strategies B={B}", ["score", *evaluation, "--budget", B, "--strategy", *map(str, solved.values()),
                                             "--out", str(scored)], log)
        results += [base, scored]
    step("compare", ["compare", *map(str, results), "--across-budgets", "--plot", str(out / "sweep.png"),
                     "--json", str(out / "compare.json")], log)
    comparison = compare([load_results(r) for r in results], sources=[str(r) for r in results], across_budgets=True)
    (out / "table.md").write_text(to_markdown(comparison) + "\n")
    (out / "solvers.md").write_text(solver_report(out) + "\n")
    (out / "timings.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"\ndone: {out}/ (table.md, solvers.md, compare.json, sweep.png, results-*.json, strategies/); step times {log}")
    return 0


def solver_report(out: Path) -> str:
    """Markdown: per budget and scored strategy, the table's predicted degradation (from the
    strategy's provenance) beside the measured suite scores and gap recovered (from compare.json)."""
    rows = json.loads((out / "compare.json").read_text())["rows"]
    suites = sorted({s for r in rows for s in r["suites"]})
    head = ["strategy", "B", "pred. ΔPPL", "pred. 1−cos"] + suites + [f"gap {s}" for s in suites]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    for r in sorted((r for r in rows if r["kind"] == "strategy"), key=lambda r: (r["budget"], r["name"])):
        path = out / "strategies" / f"{r['name']}.json"
        predicted = json.loads(path.read_text())["provenance"].get("predicted", {}) if path.exists() else {}
        name = " = ".join([r["name"], *r.get("aliases", [])])  # identical strategies are merged by compare
        cells = [name, f"{r['budget']:g}", fmt(predicted.get("dppl"), ".3g"), fmt(predicted.get("1-cosine"), ".3g")]
        cells += [fmt(r["suites"].get(s), ".1f") for s in suites]
        cells += [fmt(None if r["gap_recovered"].get(s) is None else 100 * r["gap_recovered"][s], ".0f") + ("%" if r["gap_recovered"].get(s) is not None else "") for s in suites]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _same_strategy(a: Path, b: Path) -> bool:
    return Strategy.load(a).digest() == Strategy.load(b).digest()

if __name__ == "__main__":
    raise SystemExit(main())
