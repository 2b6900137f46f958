"""The reproduction study's report files: ``table.md`` (the comparison with predicted vs measured
agreement) and ``solvers.md`` (each strategy's predicted degradation beside its measured scores).

Split out of ``benchmarks/reproduce.py``, which runs the steps; this module only reads their outputs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polykv_search.compare import compare, load_results, notes, to_markdown
from polykv_search.io import atomic_write_text


def signals_path(args: argparse.Namespace, retrieval: bool = False) -> Path:
    return args.out / ("signals-retrieval.json" if retrieval else "signals.json")


def write_reports(args: argparse.Namespace, results: list[Path], log: dict) -> None:
    """``table.md``, ``solvers.md`` and ``timings.json`` in ``args.out`` from the finished results."""
    out = args.out
    comparison = compare([load_results(r) for r in results], sources=[str(r) for r in results], across_budgets=True)
    calibration = "strategies calibrated on prose" + (
        f", the `*-retrieval` ones on a retrieval-aware table of the same calibration split "
        f"(--retrieval-mix {args.retrieval_mix})"
        if args.retrieval_mix
        else ""
    )
    lines = [
        f"{args.samples} samples per task, {args.context_len}-token contexts, seed {args.seed}; "
        f"score ± half-width of the 95 % paired bootstrap interval; {calibration}.",
        "",
        to_markdown(comparison),
        "",
        *[f"- {n}" for n in notes(comparison)],
        "",
        *prediction_lines(comparison, args),
    ]
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "solvers.md", solver_report(out) + "\n")
    atomic_write_text(out / "timings.json", json.dumps(log, indent=2) + "\n")


def prediction_lines(comparison, args: argparse.Namespace) -> list[str]:
    """Predicted vs measured: Spearman's ρ of each calibration table's predicted KL with the measured
    scores and KL, per budget (the check that the signals predict anything)."""
    from polykv_search.compare.prediction import describe, prediction_agreement
    from signals import SignalTable
    from signals.predict import strategy_predictor

    lines = []
    for retrieval in (False, True) if args.retrieval_mix else (False,):
        path = signals_path(args, retrieval)
        predict = strategy_predictor(SignalTable.load(path), "kl")
        lines.append(f"Predicted KL ({path.name}) vs measured, Spearman's ρ with a 95 % bootstrap over entries:")
        lines += [f"- {describe(a)}" for a in prediction_agreement(comparison, predict, seed=args.seed)]
    return lines


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
