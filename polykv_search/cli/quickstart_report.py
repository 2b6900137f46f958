"""quickstart's report, ``report.md``: the terminal's compare output as markdown, with the run's setting.

It opens with at most three lines (:func:`polykv_search.compare.recommend.brief`): the strategy to use at
the budget by the rule of ``compare --help``, why, and its ``polykv-search export`` command for kvpress
(or why kvpress cannot express it). Then the table once, then the details: the setting, the
recommendation's reasons per suite and the Python that applies it, the verdict's sentences
(:func:`polykv_search.compare.verdict.verdict`: what is resolved better or worse than the best uniform,
what is not and roughly how many samples would resolve it, the gap to recover, the memory held), the
notes and the step times.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: the opening line of the verdict when the results have no intervals to judge by
NO_VERDICT = "No verdict: these results have no per-sample scores, so no difference can be resolved."


def verdict_sentences(comparison) -> list[str]:
    from polykv_search.compare.verdict import verdict

    return verdict(comparison) or [NO_VERDICT]


def report_text(comparison, doc: dict, timings: dict, args: argparse.Namespace, calibration: str, signals: Path) -> str:
    """The markdown of ``report.md``: at most three lines of verdict (what to use, why, its export command),
    the table once, then the details: setting, the recommendation's reasons and deployment, the verdict's
    sentences, notes, plot, step times."""
    from polykv_search import compare as cmp
    from polykv_search.compare.recommend import brief, details, export_block, recommend
    from polykv_search.protocol import protocol_of

    settings = doc["provenance"]["settings"]
    warning = cmp.unresolved_warning(comparison)
    found = recommend(comparison)
    lines = [
        "# polykv-search quickstart",
        "",
        *[f"{line}  " for line in brief(comparison, found)],
        "",
        cmp.to_markdown(comparison),
        *export_block(found, markdown=True),
        "",
        "## Details",
        "",
        f"Model `{doc['provenance']['model']}`, global budget B = {args.budget:g}, evaluation context "
        f"{settings['context_len']} tokens, {settings['samples']} samples per task, suites `{args.suite}`, "
        f"{protocol_of(doc['provenance'])} protocol. "
        f"Calibration: {args.calib_samples} samples of {args.context_len} + {args.continuation_len} tokens, "
        f"patterns {','.join(args.patterns)}, budgets {','.join(map(str, args.budgets))} "
        f"(`{signals.name}`). {calibration}{_head_level(args)}",
        "",
        *details(found, markdown=True),
        " ".join(verdict_sentences(comparison)),
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
) -> None:
    """Write ``out/report.md`` atomically (the terminal got the same verdict, table and details from the
    quickstart's compare step)."""
    from polykv_search import compare as cmp
    from polykv_search.io import atomic_write_text

    doc = cmp.load_results(results)
    comparison = cmp.compare([doc], sources=[str(results)])
    atomic_write_text(out / "report.md", report_text(comparison, doc, timings, args, calibration, signals))
