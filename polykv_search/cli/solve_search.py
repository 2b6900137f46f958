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


def print_pool_prior(record: dict[str, Any]) -> None:
    """Every exponent measured (the plain pool first, the chosen one starred) with its KL, its difference to the
    plain pool and its weights' range; the last line says which was kept."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=_title("pool-prior", record["kinds"]), title_justify="left")
    table.add_column("weights", overflow="fold")
    table.add_column(f"KL [{record['level']:.0%}]", justify="right")
    table.add_column("KL − plain pool", justify="right")
    table.add_column("w min–max", justify="right")
    for name, iv in record["means"].items():
        weights = [w for ws in record["weights"][name].values() for w in ws]
        star = " *" if name == record["chosen"] else ""
        versus = _iv(record["versus_solved"].get(name), "+")
        table.add_row(Text(name + star), _iv(iv), versus, f"{min(weights):.3g}–{max(weights):.3g}")
    out.print(table)
    chosen = record["chosen"]
    line = f"pool-prior: {chosen} kept" + ("" if record["replaced"] else " (no exponent resolved better)")
    out.print(line, markup=False, highlight=False)
