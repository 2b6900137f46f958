"""`solve --method search` and `pool-prior`: what they measured, as readable tables."""

from __future__ import annotations

from typing import Any

from polykv_search.cli.common import out


def _iv(iv: dict[str, Any] | None, sign: str = "") -> str:
    if iv is None:
        return ""
    fmt = lambda v: "∞" if v is None else f"{v:{sign}.4f}"  # noqa: E731
    return f"{iv['estimate']:{sign}.4f} [{fmt(iv['low'])}, {fmt(iv['high'])}]"


def _title(what: str, kinds: list[str]) -> str:
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds)))
    return f"{what}: KL to FullKV on {len(kinds)} calibration samples ({counts})"


def print_search(record: dict[str, Any]) -> None:
    """The starts (the chosen one starred) with their KL, then every accepted move with its KL and its difference
    to the strategy before it; the last line compares the result with the start."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=_title("search", record["kinds"]), title_justify="left")
    table.add_column("start / accepted move", overflow="fold")
    table.add_column(f"KL [{record['level']:.0%}]", justify="right")
    table.add_column("KL − before", justify="right")
    for name, iv in record["starts"].items():
        table.add_row(Text(name + (" *" if name == record["start"] else "")), _iv(iv), "")
    for i, move in enumerate(record["moves"], start=1):
        table.add_row(Text(f"{i}. {move['label']}"), _iv(move["kl"]), _iv(move["versus_before"], "+"))
    out.print(table)
    final = record["result_minus_start"]
    if final is None:
        line = f"search: the result is the start, {record['start']} (no move resolved better)"
    else:
        kept = record["moves_kept"]
        line = f"search: {kept} move(s) kept; KL(result) − KL(start) {_iv(final, '+')} at {record['level']:.0%}"
    out.print(line, markup=False, highlight=False)
    out.print(cost_line("search", record), markup=False, highlight=False)


def cost_line(what: str, record: dict[str, Any]) -> str:
    """What a solve that measures whole strategies cost: its strategies, model runs and calls, and minutes."""
    cost = record.get("cost") or {}
    measured = record.get("strategies_evaluated", len(record.get("means") or {}))
    line = f"{what} cost: {measured} strategies measured"
    if "strategy_runs" in cost:
        line += (
            f", {cost['strategy_runs']} strategy runs and {cost['fullkv_runs']} FullKV references in "
            f"{cost['forward_calls']:,} model calls ({cost['values_from_journal']} values from the journal)"
        )
    minutes = f"{cost['wall_s'] / 60:.1f} min" if "wall_s" in cost else "time not recorded"
    model = f", {cost['model_seconds'] / 60:.1f} in the model" if "model_seconds" in cost else ""
    return f"{line}; {minutes}{model}"


def print_pool_prior(record: dict[str, Any]) -> None:
    """Every level measured (the plain pool first, the chosen one starred) with its KL, its difference to the
    plain pool and the range of its priors (per layer or per KV head); the last line says which was kept."""
    from rich.table import Table
    from rich.text import Text

    prior = record.get("prior", "weight")
    per = "KV head" if record.get("granularity") == "head" else "layer"
    table = Table(title=_title("pool-prior", record["kinds"]), title_justify="left")
    table.add_column(f"{prior}s per {per}", overflow="fold")
    table.add_column(f"KL [{record['level']:.0%}]", justify="right")
    table.add_column("KL − plain pool", justify="right")
    table.add_column("min–max", justify="right")
    for name, iv in record["means"].items():
        values = list(_flat(record[prior + "s"][name].values()))
        star = " *" if name == record["chosen"] else ""
        versus = _iv(record["versus_solved"].get(name), "+")
        table.add_row(Text(name + star), _iv(iv), versus, f"{min(values):.3g}–{max(values):.3g}")
    out.print(table)
    chosen = record["chosen"]
    word = "exponent" if prior == "weight" else "level"
    line = f"pool-prior: {chosen} kept" + ("" if record["replaced"] else f" (no {word} resolved better)")
    out.print(line, markup=False, highlight=False)
    out.print(cost_line("pool-prior", record), markup=False, highlight=False)


def _flat(values):
    """The numbers of nested lists (per phase, per layer, per KV head)."""
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v
