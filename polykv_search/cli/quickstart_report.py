"""quickstart's report: ``report.md`` and the terminal summary, both opening with the verdict.

The verdict (:func:`polykv_search.compare.verdict.verdict`) is 3–6 sentences generated from the
results: which strategies are resolved better or worse than the best uniform, on which measure,
with intervals; what is not resolved and roughly how many samples would resolve it; whether there
is a gap to recover; the memory held. The tables, notes and step times follow.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from polykv_search.cli.common import out as stdout

#: the opening line of the verdict when the results have no intervals to judge by
NO_VERDICT = "No verdict: these results have no per-sample scores, so no difference can be resolved."


def verdict_sentences(comparison) -> list[str]:
    from polykv_search.compare.verdict import verdict

    return verdict(comparison) or [NO_VERDICT]


def report_text(comparison, doc: dict, timings: dict, args: argparse.Namespace, calibration: str, signals: Path) -> str:
    """The markdown of ``report.md``: verdict, setting, table, notes, plot, step times."""
    from polykv_search import compare as cmp
    from polykv_search.protocol import protocol_of

    settings = doc["provenance"]["settings"]
    warning = cmp.unresolved_warning(comparison)
    lines = [
        "# polykv-search quickstart",
        "",
        " ".join(verdict_sentences(comparison)),
        "",
        f"Model `{doc['provenance']['model']}`, global budget B = {args.budget:g}, evaluation context "
        f"{settings['context_len']} tokens, {settings['samples']} samples per task, suites `{args.suite}`, "
        f"{protocol_of(doc['provenance'])} protocol. "
        f"Calibration: {args.calib_samples} samples of {args.context_len} + {args.continuation_len} tokens, "
        f"patterns {','.join(args.patterns)}, budgets {','.join(map(str, args.budgets))} "
        f"(`{signals.name}`). {calibration}{_head_level(args)}",
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
        _step_times(timings, doc["provenance"].get("execution") or {}),
    ]
    return "\n".join(lines) + "\n"


def _step_times(timings: dict, execution: dict) -> str:
    """The report's last line: each step's seconds, and how the scoring ran (its processes and threads)."""
    if not timings:
        return "All steps reused."
    text = "Step times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items())
    if execution.get("jobs", 1) > 1:
        text += f" (score: {execution['jobs']} {execution.get('backend', 'loky')} workers"
        text += f", {execution['threads']} thread(s) each)" if execution.get("threads") else ")"
    return text


def _head_level(args: argparse.Namespace) -> str:
    if not args.head_level:
        return ""
    return (
        f" Head level: retrieval scores and head cells ({','.join(args.head_patterns)} at "
        f"{','.join(map(str, args.head_cells))}) on {args.calib_samples} evidence + {args.calib_samples} prose "
        "samples of the same split (`signals-heads.json`), solved by `ilp --granularity head`."
    )


def write_report(
    out: Path, results: Path, timings: dict, args: argparse.Namespace, calibration: str, signals: Path
) -> list[str]:
    """Write ``out/report.md`` atomically; returns the verdict's sentences (for the terminal summary)."""
    from polykv_search import compare as cmp
    from polykv_search.io import atomic_write_text

    doc = cmp.load_results(results)
    comparison = cmp.compare([doc], sources=[str(results)])
    atomic_write_text(out / "report.md", report_text(comparison, doc, timings, args, calibration, signals))
    return verdict_sentences(comparison)


def print_summary(sentences: list[str]) -> None:
    """The terminal summary (stdout, beside the tables): the verdict, one sentence a line."""
    stdout.rule("[bold]verdict")
    for sentence in sentences:
        stdout.print(sentence, highlight=False, soft_wrap=True)
