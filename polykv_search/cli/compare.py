"""`polykv-search compare`: score results side by side, with intervals, gap recovered, markdown and plots."""

from __future__ import annotations

import argparse
import sys

from rich.markup import escape

from polykv_search.cli.arg_types import at_most, seed_value
from polykv_search.cli.common import CLIError, ParagraphHelpFormatter, check_output_path, console, out
from polykv_search.cli.outputs import check_not_an_input
from polykv_search.compare.recommend import RULE
from signals.predict import OBJECTIVES as OBJECTIVE_CHOICES


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="compare score results: one table with intervals and gap recovered, markdown, plots",
        description="Merge results files written by `polykv-search score` into one table: rows = strategies and "
        "baselines (deduplicated by strategy digest + budget), columns = suite scores as score±h (h = half-width of "
        "the 95% paired bootstrap interval over samples; per-task scores with --tasks), the share of FullKV's KV "
        "bytes held, and gap recovered per suite, (S - S_bestuniform) / (S_full - S_bestuniform), where "
        "S_bestuniform is the best uniform baseline at the same budget on that suite (a dash, with a note under "
        "the table, when FullKV - best uniform is not resolved above 0). ▲/▼ marks a difference to the best "
        "uniform whose interval excludes 0. --details "
        "adds the differences, KV MiB, gap intervals and KL(FullKV‖entry) fidelity columns. The best value per "
        "column (within each budget) is highlighted. Results made on different samples or models, or at different "
        "budgets, are refused unless --allow-mismatch / --across-budgets. Files that split a suite's tasks between "
        "them (e.g. one `score --suite ruler/TASK` run per task; they may overlap on tasks of the same samples) "
        "are task shards of one run: merged, each row's suite score is the mean over every task of the suite."
        "\n\nThe terminal shows at most three lines of at most 80 columns before the table (what to use, why, and "
        "where its export commands are; or, when nothing is resolved, how many samples would decide), the table "
        "once, the `polykv-search export --format kvpress` commands on their own lines, then the details (the "
        "recommendation's reasons, the verdict, notes). --json holds it all, the recommendation included.\n\n" + RULE,
        formatter_class=ParagraphHelpFormatter,
    )
    p.add_argument("results", nargs="+", metavar="RESULTS.json", help="results files from `polykv-search score`")
    p.add_argument("--tasks", action="store_true", help="also show per-task scores")
    p.add_argument(
        "--details",
        action="store_true",
        help="also show differences to the best uniform, KV MiB, gap intervals and KL columns (wider than 80 columns)",
    )
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print a GitHub markdown table (with every detail column) instead of the terminal table",
    )
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="write a PNG: per-layer budgets/patterns of each non-uniform strategy, "
        "and scores with error bars (score vs budget when several budgets are compared)",
    )
    p.add_argument(
        "--json", dest="json_out", metavar="OUT.json", help="write the comparison, with every interval, as JSON"
    )
    p.add_argument(
        "--across-budgets",
        action="store_true",
        help="allow results at several budgets; rows are grouped by budget and gap recovered is computed per budget",
    )
    p.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare results made on different samples or models (each run keeps its own references)",
    )
    p.add_argument(
        "--signals",
        metavar="SIGNALS.json",
        help="also rank-correlate each entry's degradation predicted from this signal table with the measured "
        "scores and KL per budget (Spearman's rho with a bootstrap interval over the entries)",
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVE_CHOICES,
        default="kl",
        help="the predicted degradation for --signals (default kl)",
    )
    p.add_argument("--seed", type=seed_value, default=0, help="seed of the bootstrap resampling (default 0)")
    p.add_argument(
        "--level",
        type=_level,
        default=None,
        help="confidence level of every interval and mark (default 0.95; e.g. 1 - 0.05/m for a Bonferroni "
        "correction over m comparisons)",
    )
    p.add_argument(
        "--resamples",
        type=_resamples,
        default=None,
        help=f"bootstrap resamples per interval (default 9999, scipy's default; at most {MAX_RESAMPLES:,})",
    )
    p.set_defaults(func=run)


#: The most ``--resamples``: 100 times scipy's default, whose Monte Carlo error is already well inside an interval's
#: width; scipy holds every resample's indices at once (10**12 would fail for memory after the files are read).
MAX_RESAMPLES = 1_000_000


_resamples = at_most(MAX_RESAMPLES, "resamples")


def _level(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1 (exclusive), got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from polykv_search import compare as cmp
    from polykv_search import stats
    from polykv_search.compare.recommend import brief, export_block, recommend
    from polykv_search.compare.recommend import details as recommendation_details
    from polykv_search.compare.verdict import verdict
    from polykv_search.io import write_json

    inputs = [("a results file it compares", path) for path in args.results] + [("the --signals table", args.signals)]
    for path, flag in ((args.json_out, "--json"), (args.plot, "--plot")):
        if path is not None:  # "" is refused, not taken for "no output"
            check_output_path(path, flag)
            check_not_an_input(path, flag, inputs)
    predict = _predictor(args) if args.signals else None  # a bad table fails before any output
    try:
        docs = [cmp.load_results(path) for path in args.results]
        comparison = cmp.compare(
            docs,
            sources=args.results,
            allow_mismatch=args.allow_mismatch,
            across_budgets=args.across_budgets,
            seed=args.seed,
            resamples=args.resamples or stats.RESAMPLES,
            level=args.level or stats.LEVEL,
        )
    except cmp.CompareError as err:
        raise CLIError(str(err)) from None
    if not comparison.rows:
        raise CLIError("the results files hold no entries")
    agreement = _agreement(args, comparison, predict) if predict else None  # refused before any output
    for warning in comparison.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    found = recommend(comparison)
    head = brief(comparison, found)
    details = [cmp.describe(comparison), *recommendation_details(found), *verdict(comparison)]
    if args.markdown:
        sys.stdout.write("".join(f"{line}  \n" for line in head) + "\n")
        sys.stdout.write(cmp.to_markdown(comparison, tasks=args.tasks) + "\n")
        sys.stdout.write("".join(f"{line}\n" for line in [*export_block(found, markdown=True), ""]))
        sys.stdout.write("".join(f"{line}\n" for line in recommendation_details(found, markdown=True)))
        notes = [cmp.describe(comparison), *verdict(comparison), *cmp.notes(comparison)]
        sys.stdout.write("".join(f"- {line}\n" for line in notes))
    else:
        # at most three lines, the table once, then the details (the lines on their own: as the table's
        # title they would wrap to a narrow table's width); entry names hold [k=v], so no markup
        for line in head:
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        _print_uncut(comparison, args.tasks, args.details)
        block = export_block(found)  # the export commands right under the table, set apart by blank lines
        for line in [*(["", *block, ""] if block else []), *details]:
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        for line in _legend(comparison, args.details) + cmp.notes(comparison):
            console.print(line, style="dim", highlight=False, markup=False)  # entry names hold [k=v]
    if agreement is not None:
        _print_agreement(args, agreement)
    if args.json_out:
        doc = comparison.to_json()
        doc["recommendation"] = {"rule": RULE, "brief": head, "budgets": [r.to_json() for r in found]}
        if agreement is not None:
            doc["prediction"] = {
                "signals": args.signals,
                "objective": args.objective,
                "agreement": [a.to_json() for a in agreement],
            }
        write_json(args.json_out, doc)
        console.print(f"wrote {args.json_out}")
    if args.plot:
        with console.status("plotting ..."):
            cmp.plot(comparison, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def _predictor(args):
    """``strategy JSON -> predicted degradation`` from ``--signals``; a table that lacks the
    ``--objective``'s signal is refused here (as ``solve`` refuses it), not shown as an empty table."""
    from signals import SignalTable, SignalTableError
    from signals.predict import cell_costs, strategy_predictor

    table = SignalTable.load(args.signals)
    try:
        cell_costs(table, args.objective)
    except SignalTableError as err:
        raise CLIError(
            f"--signals {args.signals}: --objective {args.objective}: {str(err).removeprefix('objective: ')}"
        ) from None
    return strategy_predictor(table, args.objective)


def _agreement(args, comparison, predict) -> list:
    """The rank agreement of the table's predictions with the measured values; a table that predicts none of
    the entries (a head-cells table, another model's) is refused rather than shown as an empty table."""
    from polykv_search import stats
    from polykv_search.compare.prediction import prediction_agreement

    agreement = prediction_agreement(comparison, predict, seed=args.seed, resamples=args.resamples or stats.RESAMPLES)
    if not agreement:
        raise CLIError(
            f"--signals {args.signals}: predicts none of the entries (no entry's layers, patterns and budgets are "
            "all cells of this table; a head-cells table such as signals-heads.json holds one layer-level cell); "
            "give the layer-level table the strategies were solved on"
        )
    return agreement


def _print_agreement(args, agreement: list) -> None:
    from polykv_search.compare.prediction import describe

    out.print(f"predicted {args.objective} degradation vs measured (Spearman, 95 % bootstrap over entries):")
    for a in agreement:
        out.print(f"  {describe(a)}", highlight=False)


def _legend(comparison, details: bool) -> list[str]:
    lines = [
        (
            "gap = (S - S_bestuniform) / (S_full - S_bestuniform) per suite at the same budget; "
            "- (see the notes) without FullKV or a uniform baseline, or when FullKV - best uniform is not resolved "
            "above 0"
        )
    ]
    if not details and comparison.has_intervals:
        more = ", KL(FullKV‖entry) fidelity" if comparison.fidelity_suites else ""
        lines.append(f"--details: differences to the best uniform{more} and gap intervals")
    return lines


def _print_uncut(comparison, tasks: bool, details: bool) -> None:
    """Print the comparison so that no cell is cut: in the compact table long entry names may fold onto
    a second line; a table too wide for the terminal (``--tasks``, ``--details``) is split by columns into
    tables that each fit, the entry column repeated on every one."""
    from rich.console import Console
    from rich.measure import Measurement

    from polykv_search import compare as cmp

    table = cmp.to_rich(comparison, tasks=tasks, details=details, title="")
    needed = Measurement.get(out, out.options.update_width(10_000), table)
    if needed.maximum <= out.width or (not (tasks or details) and needed.minimum <= out.width):
        out.print(table)
        return
    for i, page in enumerate(cmp.to_rich_pages(comparison, out.width, tasks=tasks, details=details)):
        if i:
            out.print()
        wide = Measurement.get(out, out.options.update_width(10_000), page).maximum
        if wide <= out.width:
            out.print(page)
        else:  # one column wider than the terminal: printed whole (Console.print caps width= at its own)
            kind = dict(force_terminal=out.is_terminal, color_system=out.color_system, no_color=out.no_color)
            Console(width=wide, **kind).print(page, crop=False)
