"""Words around a comparison: its one-line description, the notes under a table and its unresolved
differences (the compact summary ``score`` prints is :func:`~.tables.summary_table`)."""

from __future__ import annotations

from polykv_search import stats
from polykv_search.compare.model import Comparison, fmt_budget, ordered


def describe(c: Comparison) -> str:
    """One line about what was compared (model, context, samples, budgets)."""
    run = c.runs[0]
    s = run["settings"]
    bits = [str(run.get("model") or "?")]
    if s.get("context_len"):
        bits.append(f"context {s['context_len']}")
    if s.get("samples"):
        bits.append(f"{s['samples']} sample{'s' if s['samples'] != 1 else ''} per task")
    if isinstance(s.get("seed"), list):  # task shards: one seed per file
        bits.append("seeds " + ", ".join(map(str, s["seed"])))
    elif s.get("seed") is not None:
        bits.append(f"seed {s['seed']}")
    if c.budgets:
        bits.append("B = " + ", ".join(f"{b:g}" for b in c.budgets))
    if run.get("protocol"):
        bits.append(str(run["protocol"]))
    if c.multi_run:
        bits.append(f"{len(c.runs)} mismatched runs")
    return "compare — " + ", ".join(bits)


def notes(c: Comparison) -> list[str]:
    """Lines to print under a table: what ± and the marks mean, the references, why a gap shows a dash."""
    st = c.statistics
    lines = []
    if c.has_intervals:
        lines.append(
            f"±: half-width of the {100 * st.get('level', stats.LEVEL):.4g}% paired bootstrap interval "
            f"({st.get('resamples')} resamples, seed {st.get('seed')}; ±? = a task has a single sample); "
            "▲/▼: resolved difference to the best uniform at the same budget (its interval excludes 0)"
        )
    else:
        lines.append("no per-sample scores in these results: no intervals")
    for (run, budget), refs in _by_group(c).items():
        where = f"B={fmt_budget(budget)}" + (f" [{c.runs[run]['label']}]" if c.multi_run else "")
        named = [f"{r.suite} {r.best_uniform}" for r in refs if r.best_uniform]
        if named:
            lines.append(f"best uniform at {where}: " + ", ".join(named))
        kl = [f"{r.suite} {r.kl_best_uniform}" for r in refs if r.kl_best_uniform]
        if kl:
            lines.append(f"lowest-KL uniform at {where}: " + ", ".join(kl))
    lines += ordered(_gap_note(r) for r in c.references if r.gap_note or r.full_minus_uniform is None)
    lines += ordered(f"KL gap -: {r.kl_gap_note}" for r in c.references if r.kl_gap_note)
    return lines


def _gap_note(ref) -> str:
    """Why the gap recovered column shows a dash for this reference."""
    if ref.gap_note:
        return f"gap -: {ref.gap_note}"
    return (
        f"gap -: {ref.suite} at B={fmt_budget(ref.budget)} has no per-sample scores, so FullKV − best uniform "
        "cannot be resolved"
    )


def unresolved(c: Comparison) -> list[str]:
    """One short line per reported difference to the best uniform whose interval contains 0.

    Covers every row's difference per suite (the best uniform itself excluded) and FullKV − best
    uniform of each reference (when that is unresolved, gap recovered is undefined).
    """
    lines = []
    for ref in c.references:
        d = ref.full_minus_uniform
        if d is not None and not d.excludes_zero:
            where = f"{ref.suite} (B={fmt_budget(ref.budget)})"
            lines.append(f"{ref.full} vs {ref.best_uniform} on {where}: {signed(d)}, not resolved")
    for row in c.rows:
        for suite, d in row.diff.items():
            if d is not None and not d.excludes_zero:
                ref = c.reference(row.run, row.budget, suite)
                lines.append(
                    f"{row.name} vs {ref.best_uniform if ref else 'best uniform'} on {suite} "
                    f"(B={fmt_budget(row.budget)}): {signed(d)}, not resolved"
                )
    return lines


def unresolved_warning(c: Comparison, shown: int = 3) -> str | None:
    """One line saying how many differences to the best uniform are not resolved (None if all are).

    Names the first ``shown`` of them, e.g. ``"4 of 22 differences to the best uniform are not
    resolved (their 95% intervals contain 0): pyramid on broad, ilp-B64 on ruler, ... "``.
    """
    diffs = [(r.name, s, d) for r in c.rows for s, d in r.diff.items() if d is not None]
    open_ = [(n, s) for n, s, d in diffs if not d.excludes_zero]
    refs = [r for r in c.references if r.full_minus_uniform is not None and not r.full_minus_uniform.excludes_zero]
    if not open_ and not refs:
        return None
    level = f"{100 * c.statistics.get('level', stats.LEVEL):.0f}%"
    names = [f"{n} on {s}" for n, s in open_[:shown]] + ["…"] * (len(open_) > shown)
    line = (
        f"{len(open_)} of {len(diffs)} differences to the best uniform are not resolved (their {level} intervals "
        f"contain 0)" + (": " + ", ".join(names) if names else "")
    )
    if refs:
        line += f"; FullKV − best uniform is not resolved on {', '.join(sorted({r.suite for r in refs}))} (gap -)"
    return line


def _by_group(c: Comparison) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    for ref in c.references:
        out.setdefault((ref.run, ref.budget), []).append(ref)
    return out


def signed(iv: stats.Interval) -> str:
    """``+1.2 [-0.3, +2.7]``: an interval of a difference, signed (one decimal)."""
    if not iv.bounded:
        return f"{iv.estimate:+.1f} (a task has a single sample)"
    return f"{iv.estimate:+.1f} [{iv.low:+.1f}, {iv.high:+.1f}]"
