"""Tables of a comparison: markdown, a rich terminal table that fits 80 columns, notes, warnings.

Every score is shown as ``score±h`` where ``h`` is the half-width of its bootstrap interval
(``±?`` when a task has a single sample, no ``±`` without per-sample records). ``▲`` / ``▼``
after a suite score: the paired difference to the best uniform baseline at the same budget is
resolved (its interval excludes 0) above / below it; no mark means "not resolved".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polykv_search.compare.merging import compare
from polykv_search.compare.model import Comparison, Row, finite, fmt_budget
from polykv_search.compare.summary import describe, notes
from polykv_search.stats import GAP_CLIP, Gap, Interval

UP, DOWN = "▲", "▼"
#: the entry column of the terminal table folds longer names rather than cutting numbers
NAME_MIN_WIDTH = 14


@dataclass(frozen=True)
class Column:
    """One table column: ``key`` is ``kind`` or ``kind:argument`` (``suite:ruler``)."""

    key: str
    header: str
    better: str  # "high", "low" or ""

    @property
    def kind(self) -> str:
        return self.key.partition(":")[0]

    @property
    def arg(self) -> str:
        return self.key.partition(":")[2]


def columns(c: Comparison, tasks: bool = False, details: bool = True, budget: bool = True) -> list[Column]:
    """The columns shown: compact (``details=False``) keeps suites, KV % and gap recovered."""
    cols = [Column("name", "entry", "")]
    if c.multi_run:
        cols.append(Column("run", "run", ""))
    if budget or c.multi_budget or c.multi_run:
        cols.append(Column("budget", "B", ""))
    if tasks:
        cols += [Column(f"task:{t}", t, "high") for t in c.tasks]
    cols += [Column(f"suite:{s}", s, "high") for s in c.suites]
    if details and c.has_intervals:
        cols += [Column(f"diff:{s}", f"Δ {s}", "high") for s in c.suites]
    if details:
        cols.append(Column("kv_mib", "KV MiB", "low"))
    cols.append(Column("kv_ratio", "KV % FullKV", "low"))
    cols += [Column(f"gap:{s}", f"gap {s}", "high") for s in c.suites]
    if details:
        for s in c.fidelity_suites:
            cols += [Column(f"kl:{s}", f"KL {s}", "low"), Column(f"klgap:{s}", f"KL gap {s}", "high")]
        for s, names in c.bucket_suites.items():  # where decoding drifts: KL per position bucket
            cols += [Column(f"klb:{s}@{b}", f"KL {s} {b}", "low") for b in names]
    return cols


def _bucket(row: Row, arg: str) -> Interval | None:
    suite, _, bucket = arg.rpartition("@")
    return row.kl_buckets.get(suite, {}).get(bucket)


# ===================================================================================== cells
def value(c: Comparison, row: Row, col: Column) -> Any:
    """The point value behind a cell (what "best" is judged on)."""
    kind, arg = col.kind, col.arg
    if kind == "task":
        return row.scores.get(arg)
    if kind == "suite":
        return row.suites.get(arg)
    if kind == "diff":
        d = row.diff.get(arg)
        return None if d is None else d.estimate
    if kind == "gap":
        return row.gap.get(arg) if gap_shown(c, row, arg) else None
    if kind == "kl":
        iv = row.kl.get(arg)
        return None if iv is None else iv.estimate
    if kind == "klgap":
        g = row.kl_gap.get(arg)
        return None if g is None or g.interval is None else g.interval.estimate
    if kind == "klb":
        iv = _bucket(row, arg)
        return None if iv is None else iv.estimate
    if kind == "run":
        return c.runs[row.run]["label"]
    if kind == "budget":
        return row.budget
    return getattr(row, col.key)


def text(c: Comparison, row: Row, col: Column, details: bool = True) -> str:
    """The cell's text."""
    v = value(c, row, col)
    kind, arg = col.kind, col.arg
    if kind in ("name", "run"):
        return str(v)
    if kind == "budget":
        return fmt_budget(v)
    if kind == "gap":
        return "ref" if row.is_full else _gap_text(v, row.gap_iv.get(arg), details)
    if kind == "klgap":
        if row.is_full:
            return "ref"
        g = row.kl_gap.get(arg)
        return "-" if g is None else _gap_text(None if g.interval is None else g.interval.estimate, g, details)
    if kind == "diff":
        if row.is_full or arg not in row.suites:
            return "-"
        if row.diff.get(arg) is None:
            ref = c.reference(row.run, row.budget, arg)
            return "ref" if ref is not None and ref.best_uniform == row.name else "-"
        return _pm(row.diff[arg], "+.1f", ".1f") + mark(row, arg)
    if kind in ("kl", "klb"):
        iv = row.kl.get(arg) if kind == "kl" else _bucket(row, arg)
        return "-" if iv is None else _pm(iv, ".3f", ".3f")
    if v is None or not finite(v):
        return "-"
    if kind == "kv_mib":
        return f"{v:.2f}"
    if kind == "kv_ratio":
        return f"{100 * v:.1f}%"
    iv = (row.task_iv if kind == "task" else row.suite_iv).get(arg)
    cell = f"{v:.1f}" if iv is None else f"{v:.1f}±{_hw(iv, '.1f')}"
    if kind == "suite":
        cell += mark(row, arg)
    return cell


def mark(row: Row, suite: str) -> str:
    """``▲`` / ``▼`` when the difference to the best uniform is resolved, else ``""``."""
    d = row.diff.get(suite)
    if d is None or not d.excludes_zero:
        return ""
    return UP if d.low > 0 else DOWN


def _pm(iv: Interval, spec: str, hw_spec: str) -> str:
    return f"{iv.estimate:{spec}}±{_hw(iv, hw_spec)}"


def _hw(iv: Interval, spec: str) -> str:
    return f"{iv.half_width:{spec}}" if iv.bounded else "?"


def gap_shown(c: Comparison, row: Row, suite: str) -> bool:
    """Gap recovered is shown only where FullKV − best uniform is itself resolved above 0 (else a dash and a
    note under the table: without per-sample scores it cannot be resolved)."""
    ref = c.reference(row.run, row.budget, suite)
    return ref is not None and ref.gap_defined and ref.full_minus_uniform is not None


def _gap_text(point: float | None, gap: Gap | None, details: bool) -> str:
    if point is None or not math.isfinite(point):
        return "-"
    iv = gap.interval if gap is not None else None
    if iv is None:
        return f"{100 * point:.1f}%"
    if not iv.bounded:
        return f"{100 * point:.0f}%±?"
    if details:
        return f"{100 * point:.0f}% [{_bound(iv.low)}, {_bound(iv.high)}]"
    return f"{100 * point:.0f}±{100 * iv.half_width:.0f}%"


def _bound(ratio: float) -> str:
    """A gap bound in percent; at the resampling clip it means "this far or beyond"."""
    if ratio <= -GAP_CLIP:
        return f"≤{-100 * GAP_CLIP:.0f}"
    if ratio >= GAP_CLIP:
        return f"≥{100 * GAP_CLIP:.0f}"
    return f"{100 * ratio:.0f}"


def best_cells(c: Comparison, cols: Sequence[Column]) -> set[tuple[int, str]]:
    """(row index, column key) of the best value per column within each budget group.

    FullKV is the reference and is never highlighted; ties (equal as displayed) all count, and a
    column where every row of a group shows the same value highlights nothing in that group.
    """
    best: set[tuple[int, str]] = set()
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(c.rows):
        if not r.is_full:
            groups.setdefault((r.run, r.budget), []).append(i)
    for members in groups.values():
        for col in cols:
            if not col.better:
                continue
            vals = [(i, _rounded(col, value(c, c.rows[i], col))) for i in members]
            vals = [(i, v) for i, v in vals if v is not None]
            if len({v for _, v in vals}) < 2:
                continue  # nothing to single out when every row shows the same value
            target = (max if col.better == "high" else min)(v for _, v in vals)
            best.update((i, col.key) for i, v in vals if v == target)
    return best


def _rounded(col: Column, v: Any) -> float | None:
    if not finite(v):
        return None
    digits = {"kv_mib": 2, "kv_ratio": 3, "gap": 2, "klgap": 2, "kl": 3, "klb": 3}.get(col.kind, 1)
    return round(float(v), digits)


# ================================================================================== renderers
def to_markdown(c: Comparison, tasks: bool = False, details: bool = True) -> str:
    """A GitHub markdown table; best values per column (per budget group) in **bold**.

    ``details`` (default) adds the differences to the best uniform, KV MiB, gap intervals and the
    KL columns; ``tasks`` adds per-task scores.
    """
    cols = columns(c, tasks, details)
    best = best_cells(c, cols)
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(col.header) for col in cols) + " |"]
    lines.append("|" + "|".join("---" if col.kind in ("name", "run") else "---:" for col in cols) + "|")
    for i, row in enumerate(c.rows):
        cells = []
        for col in cols:
            t = esc(text(c, row, col, details))
            cells.append(f"**{t}**" if (i, col.key) in best else t)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


RICH_HEADERS = {
    "kv_mib": "KV\nMiB",
    "kv_ratio": "KV %\nFull",
    "gap": "gap\n{}",
    "diff": "Δ\n{}",
    "kl": "KL\n{}",
    "klgap": "KL gap\n{}",
}


def to_rich(
    c: Comparison,
    tasks: bool = False,
    title: str | None = None,
    details: bool = False,
    keys: Sequence[str] | None = None,
):
    """A rich Table; best values per column (per budget group) in bold green.

    The compact table (``details=False``) fits an 80-column terminal for two suites: numbers are
    never cut, long entry names fold onto a second line instead. ``keys``: only these columns (by
    :attr:`Column.key`; see :func:`to_rich_pages`).
    """
    from rich import box
    from rich.table import Table

    cols = columns(c, tasks, details, budget=False)
    if keys is not None:
        cols = [col for col in cols if col.key in keys]
    best = best_cells(c, cols)
    table = Table(
        title=title if title is not None else describe(c),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
        title_justify="left",
    )
    for col in cols:
        header = col.header.split("/")[-1] if col.kind == "task" else col.header
        if col.kind in RICH_HEADERS:
            header = RICH_HEADERS[col.kind].format(col.arg)
        elif col.kind == "klb":  # KL / suite / position bucket, stacked
            header = "KL {}\n{}".format(*col.arg.rsplit("@", 1))
        if col.kind == "name":  # may fold onto two lines in a narrow terminal, never vanish
            longest = max([len(r.name) for r in c.rows] + [len(header)])
            table.add_column(header, justify="left", overflow="fold", min_width=min(longest, NAME_MIN_WIDTH))
            continue
        width = max([len(text(c, r, col, details)) for r in c.rows] + [len(w) for w in header.split("\n")])
        table.add_column(header, justify="left" if col.kind == "run" else "right", no_wrap=True, min_width=width)
    previous = None
    for i, row in enumerate(c.rows):
        group = (row.run, row.budget)
        if previous is not None and group != previous and (c.multi_budget or c.multi_run) and row.budget is not None:
            table.add_section()
        previous = group
        cells = []
        for col in cols:
            t = text(c, row, col, details).replace("[", r"\[")
            cells.append(f"[bold green]{t}[/bold green]" if (i, col.key) in best else t)
        table.add_row(*cells, style="dim" if row.is_full else None)
    return table


#: the columns every page of a split table repeats
_ROW_LABELS = ("name", "run", "budget")


def to_rich_pages(c: Comparison, width: int, tasks: bool = False, details: bool = False) -> list:
    """:func:`to_rich` split by columns into tables that each fit ``width`` characters, the entry column
    (and run, budget) repeated on every one; one table when it fits. A column wider than ``width`` with
    the entry column beside it gets a table of its own (wider than ``width``: numbers are never cut)."""
    import io

    from rich.console import Console
    from rich.measure import Measurement

    console = Console(width=10_000, file=io.StringIO())

    def natural(keys: list[str]) -> int:
        table = to_rich(c, tasks, "", details, keys=keys)
        return Measurement.get(console, console.options, table).maximum

    cols = columns(c, tasks, details, budget=False)
    fixed = [col.key for col in cols if col.kind in _ROW_LABELS]
    pages: list[list[str]] = [[]]
    for col in cols:
        if col.kind in _ROW_LABELS:
            continue
        if pages[-1] and natural(fixed + pages[-1] + [col.key]) > width:
            pages.append([])
        pages[-1].append(col.key)
    return [to_rich(c, tasks, "", details, keys=fixed + page) for page in pages]


def summary_table(doc: dict[str, Any] | Comparison, *, title: str | None = None, **options: Any):
    """The compact table (and its notes) of one results document, for ``polykv-search score``.

    Parameters
    ----------
    doc : dict or Comparison
        A results document as written by ``score`` (schema ``polykv-results``), or its
        comparison when already made (e.g. to pass it to :func:`unresolved_warning` as well).
    title : str, optional
        The line above the table (default: :func:`describe`); not the table's own title, which would
        wrap to a narrow table's width.
    **options
        ``level``, ``resamples``, ``seed`` of the intervals (see :func:`compare`); a document's
        entries may be at several budgets (strategy files carry their own).

    Returns
    -------
    rich.console.Group
        The table, then its notes in dim text; fits an 80-column terminal for two suites.
    """
    from rich.console import Group
    from rich.text import Text

    c = doc if isinstance(doc, Comparison) else compare([doc], across_budgets=True, **options)
    # the title on a line of its own, not the table's: that would wrap to a narrow table's width
    head = Text(title if title is not None else describe(c))
    return Group(head, to_rich(c, title=""), *(Text(line, style="dim") for line in notes(c)))
