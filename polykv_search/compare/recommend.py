"""Which entry to use at each budget, by the rule ``compare --help`` states (:data:`RULE`).

Per budget (and run), the *candidates* are the entries at that budget other than FullKV that have a
score on every suite:

1. the best on a suite is the candidate with the highest suite score (the first in table order on ties);
2. a candidate is *kept* unless it is resolved below the best on some suite: the paired interval
   (the same samples and resamples as the table's) of candidate − best lies below 0;
3. of the kept candidates, the recommendation is the one that holds the least KV memory (its share of
   FullKV's cache as the table shows it, to 0.1 %); ties go to the lower KL(FullKV ‖ entry) (the mean
   over the suites that have one), then to the table's order.

The answer is one of four kinds: :data:`WINNER` (one candidate kept), :data:`TIE` (several kept, some
candidate resolved below: the least memory decides), :data:`UNRESOLVED` (no candidate is resolved below
the best anywhere: no recommendation, and the samples per task that would likely resolve the first
difference, by :func:`~polykv_search.compare.verdict.samples_to_resolve`) and :data:`SPLIT` (none kept:
each suite's best is resolved below on another suite). Deployment: :mod:`~polykv_search.compare.deploy`.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any

from polykv_search import stats
from polykv_search.compare.deploy import WIDTH, Deployment, deployment
from polykv_search.compare.gaps import aligned
from polykv_search.compare.model import Comparison, Row, finite, fmt_budget, ordered
from polykv_search.compare.summary import signed
from polykv_search.compare.verdict import SHOWN, samples_per_task, samples_to_resolve

WINNER, TIE, UNRESOLVED, SPLIT = "winner", "tie", "unresolved", "split"

RULE = (
    "Recommendation, per budget: among the entries other than FullKV scored on every suite, keep those "
    "not resolved below the best entry on any suite (the paired interval of entry - best lies below 0); "
    "recommend the kept entry that holds the least KV memory (its share of FullKV's, to 0.1 %), ties "
    "broken by the lower mean KL(FullKV‖entry), then by table order. One entry kept: a winner; none "
    "resolved below the best anywhere: nothing is resolved, no recommendation, and the samples per task "
    "that would likely resolve the first difference; none kept: the best per suite. It comes with the "
    "`polykv-search export --format kvpress` command, or why kvpress cannot express it and the Python "
    "that applies it with polykv-search's runtime."
)


@dataclass(frozen=True)
class Recommendation:
    """The rule's answer at one budget (and run).

    Attributes
    ----------
    kind : str
        :data:`WINNER`, :data:`TIE`, :data:`UNRESOLVED` or :data:`SPLIT`.
    entry : str or None
        The recommended entry (None when unresolved or split).
    broken_by : str or None
        What chose among several kept entries (:data:`TIE`): ``"memory"``, ``"kl"`` or ``"order"``.
    kept, candidates : tuple of str
        The entries not resolved below the best on any suite, and every candidate.
    best : dict
        suite -> the best candidate on it.
    reasons : tuple of str
        One line per suite (and one for the tie-break): why.
    samples_now, samples_needed : int or None
        Samples per task now, and (:data:`UNRESOLVED`) the samples per task that would likely resolve the
        first difference (``deciding``).
    """

    run: int
    budget: float
    kind: str
    entry: str | None
    broken_by: str | None
    kept: tuple[str, ...]
    candidates: tuple[str, ...]
    best: dict[str, str]
    reasons: tuple[str, ...]
    deployment: Deployment | None = None
    kv_ratio: float | None = None
    level: float = stats.LEVEL
    samples_now: int | None = None
    samples_needed: int | None = None
    deciding: str | None = None

    def headline(self, width: int = WIDTH) -> str:
        """The verdict's first line: what to use at this budget, or that nothing is recommended (the share of
        FullKV's cache left out where a long name would make the line wider than ``width``)."""
        where = f"B = {fmt_budget(self.budget)}"
        if self.kind == UNRESOLVED:
            return f"At {where} nothing is resolved: no recommendation."
        if self.kind == SPLIT:
            return f"At {where} no entry is near the best on every suite: no recommendation."
        held = f": {100 * self.kv_ratio:.1f} % of FullKV's KV cache" if self.kv_ratio is not None else ""
        line = f"Use {self.entry} at {where}{held}."
        return line if len(line) <= width else f"Use {self.entry} at {where}."

    def why(self, width: int = WIDTH) -> str:
        """The verdict's second line: the rule's reason in a few words, with the sample count where the line
        stays within ``width`` (the count and the intervals' level are also under the table)."""
        n = f"{self.samples_now:,} samples per task" if self.samples_now else ""
        if self.kind == UNRESOLVED:
            if not self.samples_now:
                return "No per-sample scores, so nothing can be resolved: score these entries again."
            if self.samples_needed is None:
                return _fit(width, f"No entry is resolved below the best at {n}.", "Nothing is resolved (see below).")
            about = f"about {self.samples_needed:,}"
            return _fit(
                width,
                f"Nothing resolved at {n}; {about} per task would likely decide.",
                f"Nothing resolved at {n}; {about} per task would decide.",
                f"Nothing resolved: {about} samples per task would decide.",
            )
        if self.kind == SPLIT:
            reason = "Each suite's best is resolved below on another suite"
        elif len(self.candidates) == 1:
            reason = "Why: the only entry scored at this budget"
        elif self.kind == WINNER:
            reason = "Why: all others are resolved below the best on a suite"
        else:
            k = len(self.kept)
            reason = {
                "memory": f"Why: least memory of the {k} not resolved below the best",
                "kl": f"Why: same memory, the lowest KL of the {k} not resolved below the best",
                "order": f"Why: first of the {k} not resolved below the best, same memory and KL",
            }[self.broken_by]
        return _fit(width, f"{reason} ({n})." if n else f"{reason}.", f"{reason}.")

    def lines(self) -> list[str]:
        """The verdict at this budget: at most three lines (what, why, where its export commands are)."""
        export = [] if self.deployment is None else [self.deployment.line()]
        return [self.headline(), self.why(), *export]

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["deployment"] = None if self.deployment is None else self.deployment.to_json()
        out["kept"], out["candidates"], out["reasons"] = list(self.kept), list(self.candidates), list(self.reasons)
        return {**out, "verdict": self.lines()}


def recommend(c: Comparison, *, deploy: bool = True) -> list[Recommendation]:
    """The rule's answer per run and budget (budgets where no entry is scored on every suite are left out).

    ``deploy=False`` skips the export check (:func:`~polykv_search.compare.deploy.deployment`)."""
    groups = ordered((r.run, r.budget) for r in c.rows if r.budget is not None and not r.is_full)
    found = [_recommend(c, run, budget, deploy) for run, budget in groups]
    return [r for r in found if r is not None]


def brief(c: Comparison, found: list[Recommendation], width: int = WIDTH) -> list[str]:
    """At most three lines, each at most ``width`` columns where the entry names allow, to read before the
    table: what to use, why, where its export commands are (:func:`export_block`)."""
    if not found:
        return ["No recommendation: no entry other than FullKV was scored on every suite."]
    if len(found) == 1:
        return found[0].lines()
    picks = "; ".join(f"B = {fmt_budget(r.budget)} {r.entry or _KIND_SHORT[r.kind]}" for r in found)
    shown = textwrap.wrap(
        f"Recommended: {picks}.", width, max_lines=2, placeholder=" … (under the table)", break_on_hyphens=False
    )
    return [*shown, "Why, and each one's export commands: under the table."]


def export_block(found: list[Recommendation], markdown: bool = False, width: int = WIDTH) -> list[str]:
    """The lines right under the table: each recommendation's kvpress export commands, at most ``width``
    columns a line (a long command continued with ``\\``; with ``markdown``: in a fenced ``sh`` block)."""
    lines = []
    for r in found:
        shell = [] if r.deployment is None else r.deployment.shell(width)
        if shell:
            title = f"# {r.entry} at B = {fmt_budget(r.budget)}" + (f", run {r.run}" if r.run else "")
            lines += [*(textwrap.wrap(title + ", for kvpress:", width, subsequent_indent="# ")), *shell]
    if markdown and lines:
        return ["```sh", *lines, "```"]
    return lines


def details(found: list[Recommendation], markdown: bool = False) -> list[str]:
    """The lines under the table: the rule's reasons per suite and the deployment of each recommendation
    (``markdown``: a bold title, a bullet per reason, the Python in a fenced block)."""
    lines = []
    for r in found:
        label = f"B = {fmt_budget(r.budget)}" + (f", run {r.run}" if r.run else "")
        title = f"Recommendation at {label}: {r.entry or _KIND_SHORT[r.kind]} ({_KIND_WORDS[r.kind]})"
        deploy = [] if r.deployment is None else r.deployment.details(markdown)
        basis = [f"{r.samples_now:,} samples per task, {100 * r.level:.4g} % paired intervals"] if r.samples_now else []
        reasons = [*r.reasons, *basis]
        if markdown:
            lines += [f"**{title}**", "", *[f"- {x}" for x in reasons], *deploy, ""]
        else:
            lines += [title, *[f"  {x}" for x in [*reasons, *deploy]]]
    return lines


_KIND_SHORT = {UNRESOLVED: "nothing resolved", SPLIT: "no single entry"}
_KIND_WORDS = {
    WINNER: "the one entry not resolved below the best on any suite",
    TIE: "several not resolved below the best; the least memory chose",
    UNRESOLVED: "nothing resolved: no recommendation",
    SPLIT: "no entry within reach of the best on every suite",
}


# ====================================================================================== the rule
def _recommend(c: Comparison, run: int, budget: float, deploy: bool) -> Recommendation | None:
    cands = [
        r
        for r in c.rows
        if r.run == run and r.budget == budget and not r.is_full and all(finite(r.suites.get(s)) for s in c.suites)
    ]
    if not cands or not c.suites:
        return None
    best = {s: max(cands, key=lambda r: r.suites[s]) for s in c.suites}  # max keeps the first on ties
    diffs = {s: {r.name: _difference(c, r, best[s], s) for r in cands if r is not best[s]} for s in c.suites}
    kept = [r for r in cands if not any(_below(diffs[s].get(r.name)) for s in c.suites)]
    now = min((samples_per_task(r, c, s) for r in cands for s in c.suites), default=0) or None
    common = dict(
        run=run,
        budget=budget,
        kept=tuple(r.name for r in kept),
        candidates=tuple(r.name for r in cands),
        best={s: b.name for s, b in best.items()},
        samples_now=now,
        level=c.statistics.get("level", stats.LEVEL),
    )
    if not kept:
        reasons = tuple(_split_reason(c, s, best[s], diffs[s]) for s in c.suites)
        return Recommendation(kind=SPLIT, entry=None, broken_by=None, reasons=reasons, **common)
    if len(cands) > 1 and len(kept) == len(cands):
        needed, deciding = _first_to_resolve(c, cands, best, diffs)
        first = f"the first to resolve: {deciding}" + (f", at about {needed:,} samples per task" if needed else "")
        reasons = (*(_open_reason(c, s, best[s], diffs[s]) for s in c.suites), first)
        return Recommendation(
            kind=UNRESOLVED,
            entry=None,
            broken_by=None,
            reasons=reasons,
            samples_needed=needed,
            deciding=deciding,
            **common,
        )
    ranked = sorted(kept, key=lambda r: (_memory(r), _kl(c, r), cands.index(r)))
    pick = ranked[0]
    broken_by = None
    reasons = [_pick_reason(c, s, pick, best[s], diffs[s]) for s in c.suites]
    if len(ranked) > 1:
        runner = ranked[1]
        broken_by = "memory" if _memory(pick) != _memory(runner) else "order"
        broken_by = "kl" if broken_by == "order" and _kl(c, pick) != _kl(c, runner) else broken_by
        reasons.append(_tie_reason(c, ranked, broken_by))
    model = c.runs[run].get("model") if run < len(c.runs) else None
    return Recommendation(
        kind=WINNER if len(kept) == 1 else TIE,
        entry=pick.name,
        broken_by=broken_by,
        reasons=tuple(reasons),
        deployment=deployment(pick, model) if deploy else None,
        kv_ratio=pick.kv_ratio,
        **common,
    )


def _fit(width: int, *options: str) -> str:
    """The first of ``options`` at most ``width`` characters long, else the last."""
    return next((text for text in options if len(text) <= width), options[-1])


def _below(d: stats.Interval | None) -> bool:
    return d is not None and d.excludes_zero and d.high < 0


def _memory(r: Row) -> float:
    """The KV share as the table shows it (0.1 %); unknown memory ranks last."""
    return round(100 * r.kv_ratio, 1) if r.kv_ratio is not None and math.isfinite(r.kv_ratio) else math.inf


def _kl(c: Comparison, r: Row) -> float:
    values = [r.kl[s].estimate for s in c.fidelity_suites if s in r.kl]
    return sum(values) / len(values) if values else math.inf


def _tasks(c: Comparison, suite: str, rows: list[Row]) -> list[str]:
    suite_of = c.statistics.get("task_suites") or {}
    return [t for t in c.tasks if suite_of.get(t, t.split("/")[0]) == suite and all(t in r.scores for r in rows)]


def _difference(c: Comparison, row: Row, best: Row, suite: str) -> stats.Interval | None:
    """The paired interval of ``row − best`` on ``suite`` (the table's own when ``best`` is its reference)."""
    ref = c.reference(row.run, row.budget, suite)
    if ref is not None and ref.best_uniform == best.name and row.diff.get(suite) is not None:
        return row.diff[suite]
    arrays, _ = aligned([row, best], _tasks(c, suite, [row, best]))
    if arrays is None:
        return None
    options = {k: c.statistics[k] for k in ("level", "resamples", "seed") if k in c.statistics}
    return stats.paired_difference_interval(arrays[0], arrays[1], **options)


def _first_to_resolve(c: Comparison, cands: list[Row], best: dict[str, Row], diffs) -> tuple[int | None, str | None]:
    """The fewest samples per task that would likely resolve a candidate's difference to a suite's best."""
    level = c.statistics.get("level", stats.LEVEL)
    found: list[tuple[int, str]] = []
    for s, b in best.items():
        for r in cands:
            if r is b:
                continue
            arrays, _ = aligned([r, b], _tasks(c, s, [r, b]))
            n = None if arrays is None else samples_to_resolve(arrays[0], arrays[1], level=level)
            d = diffs[s].get(r.name)
            if n is not None and d is not None:
                found.append((n, f"{r.name} vs {b.name} on {s} ({signed(d)})"))
    if not found:
        return None, "no difference with per-sample scores to estimate from"
    return min(found, key=lambda x: x[0])


# ===================================================================================== the words
def _score(r: Row, suite: str) -> str:
    iv = r.suite_iv.get(suite)
    return f"{r.suites[suite]:.1f}" + (f"±{iv.half_width:.1f}" if iv is not None and iv.bounded else "")


def _pick_reason(c: Comparison, suite: str, pick: Row, best: Row, diffs: dict) -> str:
    if pick is not best:
        return f"{suite}: {_score(pick, suite)}, not resolved from the best, {best.name} {_score(best, suite)} " + (
            f"({signed(diffs[pick.name])})" if diffs.get(pick.name) is not None else "(no paired interval)"
        )
    below = [n for n, d in diffs.items() if _below(d)]
    open_ = {n: d for n, d in diffs.items() if not _below(d)}
    text = f"{suite}: the best, {_score(pick, suite)}"
    if not diffs:
        text += " (no other entry at this budget)"
    else:
        text += f"; {len(below)} other{'s' if len(below) != 1 else ''} resolved below it"
        if open_:
            name, d = max(open_.items(), key=lambda x: -math.inf if x[1] is None else x[1].estimate)
            text += f", {len(open_)} not (closest: {name}" + (f" {signed(d)})" if d is not None else ")")
    full = next((r for r in c.rows if r.run == pick.run and r.is_full and finite(r.suites.get(suite))), None)
    gap = None if full is None else _difference(c, full, pick, suite)
    if gap is not None:
        text += f"; FullKV {signed(gap)} {'above it' if gap.excludes_zero and gap.low > 0 else 'not resolved above it'}"
    return text


def _tie_reason(c: Comparison, ranked: list[Row], broken_by: str) -> str:
    def held(r: Row) -> str:
        share = "?" if r.kv_ratio is None else f"{100 * r.kv_ratio:.1f} %"
        kl = _kl(c, r)
        return f"{r.name} {share}" + (f", KL {kl:.3f}" if broken_by != "memory" and math.isfinite(kl) else "")

    pick, others = ranked[0], ranked[1:]
    rule = {"memory": "the least memory", "kl": "tied on memory, the lower KL", "order": "tied, first in the table"}
    shown = [held(r) for r in others[:SHOWN]] + ([f"{len(others) - SHOWN} more"] if len(others) > SHOWN else [])
    return f"kept {len(ranked)}: {held(pick)} ({rule[broken_by]}); " + "; ".join(shown)


def _open_reason(c: Comparison, suite: str, best: Row, diffs: dict) -> str:
    text = f"{suite}: the best, {best.name} {_score(best, suite)}; no entry resolved below it"
    bounded = {n: d for n, d in diffs.items() if d is not None}
    if bounded:
        name, d = min(bounded.items(), key=lambda x: x[1].estimate)
        text += f" (farthest: {name} {signed(d)})"
    return text


def _split_reason(c: Comparison, suite: str, best: Row, diffs: dict) -> str:
    below = [n for n, d in diffs.items() if _below(d)]
    return f"{suite}: the best, {best.name} {_score(best, suite)}; resolved below it: {', '.join(below) or 'none'}"
