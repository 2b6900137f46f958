"""`polykv-search show`: a readable view of a strategy (or a signal table)."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from polykv_search.cli.common import CLIError, check_output_path, out, read_text
from polykv_search.cli.outputs import check_not_an_input
from strategies import PHASES
from strategies.choice import spec_label


def add_parser(sub) -> None:
    p = sub.add_parser(
        "show",
        help="print a strategy or signal table as a readable table",
        description="Print a strategy JSON as a per-layer table (pattern and budget per phase), "
        "or summarize a signal table.",
    )
    p.add_argument("file", help="strategy.json or signals.json")
    p.add_argument("--plot", help="signal tables: write heatmaps to this PNG")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = read_text(args.file)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise CLIError(f"{args.file}: not a JSON object") from None
    if not isinstance(doc, dict):
        raise CLIError(f"{args.file}: not a JSON object")
    kind = doc.get("schema")
    if kind == "polykv-strategy":
        from strategies import Strategy, StrategyError

        if args.plot is not None:
            raise CLIError(f"--plot draws signal tables; {args.file} is a strategy")
        try:
            strategy = Strategy.loads(text)
        except StrategyError as err:
            raise CLIError(f"{args.file}: {err}") from None
        show_strategy(strategy, args.file)
        return 0
    if args.plot is not None:  # "" is refused, not taken for "no plot"
        check_output_path(args.plot, "--plot")
        check_not_an_input(args.plot, "--plot", [("the table it shows", args.file)])
    if kind == "polykv-signals":
        from polykv_search.cli.show_signals import show_signals

        return show_signals(args.file, args.plot)
    raise CLIError(f"{args.file}: unknown schema {kind!r} (expected polykv-strategy or polykv-signals)")


_PHASE_COLUMNS = [(f"{phase} pattern", "budget") for phase in PHASES]


def show_strategy(strategy, title: str) -> None:
    """One row per layer; one pattern column for both phases when decoding repeats prefill in every layer,
    and one line per head group, so that the table reads in an 80-column terminal."""
    same = strategy.prefill == strategy.decoding  # every layer's choice, params and head groups included
    table = Table(title=title)
    table.add_column("layer", justify="right", no_wrap=True)
    for pattern, budget in (("pattern (both phases)", "budget"),) if same else _PHASE_COLUMNS:
        table.add_column(pattern, overflow="fold")
        table.add_column(budget, justify="right")
    for i, (p, d) in enumerate(zip(strategy.prefill, strategy.decoding)):
        cells = [_pat(p), _b(p.budget)] + ([] if same else [_pat(d), _b(d.budget)])
        table.add_row(str(i), *cells)
    out.print(table)
    prov = strategy.provenance
    B = "none (FullKV)" if strategy.global_budget is None else f"{strategy.global_budget:g}"
    out.print(f"B = {B}, b_min = {strategy.b_min}, solver = {prov.get('solver', '?')}, digest {strategy.digest()}")
    if strategy.has_head_groups:
        out.print(f"head groups over {strategy.num_kv_heads} KV heads, built for {strategy.context_len}-token contexts")
    for phase in PHASES:
        budgets = [b for b in strategy.budgets(phase) if b is not None]
        if budgets:
            out.print(f"{phase}: sum {_b(sum(budgets))}, min {_b(min(budgets))}, max {_b(max(budgets))}")
    for note in held_notes(strategy):
        out.print(f"note: {note}", highlight=False, markup=False)


def held_notes(strategy) -> list[str]:
    """Where the B a strategy states is not the memory it holds at every context length: ``full`` layers
    with a budget (they keep the whole context), head groups above the context length they were built for."""
    notes = []
    full = sorted({i for p in PHASES for i, c in enumerate(strategy.phase(p)) if c.pattern == "full" and c.budget})
    if full and strategy.global_budget is not None:
        notes.append(
            f"layers {','.join(map(str, full))} use pattern 'full' with a budget: they keep the whole context, so "
            "they hold more than B counts wherever the context is longer than that budget (score refuses that)"
        )
    n = strategy.context_len
    groups = [g for p in PHASES for c in strategy.phase(p) for g in c.head_groups or ()]
    above = [g.budget for g in groups if g.pattern != "full" and n is not None and g.budget > n]
    if above:
        notes.append(
            f"head groups with budgets above the {n}-token context it was built for (up to {max(above)}) count "
            f"as {n} in B; at a longer context they hold more (score refuses that)"
        )
    return notes


def _pat(choice) -> str:
    if choice.head_groups is not None:  # schema v2: pattern@budget[KV heads], one group per line
        return "\n".join(escape(g.label()) for g in choice.head_groups)
    return escape(spec_label(choice.pattern, choice.params))  # kvzip[allocation=model], as collect and solve name it


def _b(budget) -> str:
    if budget is None:
        return "all"
    return f"{budget:.1f}" if isinstance(budget, float) else str(budget)  # head groups: a mean over KV heads
