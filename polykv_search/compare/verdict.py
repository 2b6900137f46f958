"""The verdict of a comparison in a few sentences, generated from its intervals (quickstart's report opens with it).

For each budget it says, in this order:

1. which strategies (every row that is neither FullKV nor a uniform baseline) are *resolved*
   better than the best uniform baseline, on which measure, with the interval: the suite score
   (difference in points to the best uniform on that suite) and the fidelity (KL(FullKV ‖ entry) on
   the teacher-forced tasks, as the share of the lowest-KL uniform's KL it removes);
2. which are resolved worse;
3. how many comparisons are not resolved, and for the best-placed strategy on each suite (the
   highest open score difference, even below 0), roughly how many samples per task would likely
   resolve its difference to the best uniform;
4. whether FullKV is resolved above the best uniform on each suite (is there a gap to recover);
5. the memory the strategies hold, as a share of FullKV's.

**Samples to resolve** (:func:`samples_to_resolve`) use the standard normal-approximation sample
size for a paired mean difference, ``n = (z_{1−α/2} + z_{1−β})² σ_d² / δ²`` with 80 % power at the
comparison's level, where ``δ`` is the observed difference and ``σ_d²`` the observed variance of
the per-sample paired differences. A suite score is the unweighted mean of its T task means, so the
variance of its difference at n samples per task is ``Σ_t σ_t² / (T² n)`` and
``n = (z_{1−α/2} + z_{1−β})² Σ_t σ_t² / (T² δ²)``. It assumes the observed difference is the true
one, which is optimistic for a difference picked as the largest of several: read it as an order of
magnitude, not a promise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from polykv_search import stats
from polykv_search.compare.gaps import aligned
from polykv_search.compare.model import Comparison, Row, fmt_budget

#: power assumed by :func:`samples_to_resolve`
POWER = 0.8
#: sample counts above this are reported as "more than" it (the difference is tiny against its noise)
HOPELESS = 10_000
#: strategies named in one sentence before "and N more"
SHOWN = 3


def samples_to_resolve(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, level: float = stats.LEVEL, power: float = POWER
) -> int | None:
    """Samples per task that would likely resolve the paired difference of suite means ``a − b``.

    ``a`` and ``b`` hold one sequence of per-sample values per task, paired by position.
    Returns None when it cannot be estimated: no task with two samples, or an observed difference
    of 0 (no sample count resolves a difference that is not there).
    """
    if len(a) != len(b) or not a:
        raise ValueError("samples_to_resolve: a and b need the same, non-zero number of tasks")
    diffs = [np.asarray(x, dtype=float) - np.asarray(y, dtype=float) for x, y in zip(a, b, strict=True)]
    if any(d.size < 2 for d in diffs):
        return None
    delta = float(np.mean([d.mean() for d in diffs]))
    var = float(sum(d.var(ddof=1) for d in diffs)) / len(diffs) ** 2
    if delta == 0.0:
        return None
    z = norm.ppf(1 - (1 - level) / 2) + norm.ppf(power)
    return max(2, math.ceil(z * z * var / (delta * delta)))


@dataclass(frozen=True)
class Finding:
    """One resolved or unresolved comparison of a strategy with the best uniform on one measure."""

    row: Row
    suite: str
    measure: str  # "score" or "kl"
    interval: stats.Interval
    reference: str

    @property
    def better(self) -> bool:
        return self.interval.estimate > 0  # score difference, or share of KL removed

    @property
    def resolved(self) -> bool:
        return self.interval.excludes_zero

    def text(self) -> str:
        iv = self.interval
        if self.measure == "kl":
            sign = 1 if iv.estimate >= 0 else -1
            lo, hi = sorted((sign * iv.low, sign * iv.high))
            more = "lower" if sign > 0 else "higher"
            pct = f"{100 * sign * iv.estimate:.0f} % [{100 * lo:.0f}, {100 * hi:.0f}]"
            return f"{self.row.name} on {self.suite} KL ({pct} {more} than {self.reference}'s)"
        return (
            f"{self.row.name} on {self.suite} score ({iv.estimate:+.1f} [{iv.low:+.1f}, {iv.high:+.1f}] "
            f"points vs {self.reference})"
        )


def findings(c: Comparison, budget: float) -> list[Finding]:
    """Every strategy's comparison with the best uniform at ``budget``: suite scores, then KL."""
    out = []
    for row in strategy_rows(c, budget):
        for suite in c.suites:
            d, ref = row.diff.get(suite), c.reference(row.run, budget, suite)
            if d is not None and d.bounded and ref is not None and ref.best_uniform:
                out.append(Finding(row, suite, "score", d, ref.best_uniform))
        for suite, gap in row.kl_gap.items():
            ref = c.reference(row.run, budget, suite)
            if gap.interval is not None and gap.interval.bounded and ref is not None and ref.kl_best_uniform:
                out.append(Finding(row, suite, "kl", gap.interval, ref.kl_best_uniform))
    return out


def strategy_rows(c: Comparison, budget: float) -> list[Row]:
    return [r for r in c.rows if r.budget == budget and not r.is_full and not r.is_uniform]


def verdict(c: Comparison) -> list[str]:
    """The sentences, one budget after the other (3–6 per budget); ``[]`` without intervals."""
    if not c.has_intervals:
        return []
    level = c.statistics.get("level", stats.LEVEL)
    sentences = []
    for budget in c.budgets:
        found = findings(c, budget)
        if not found:
            continue
        where = f"At B = {fmt_budget(budget)}"
        better = [f for f in found if f.resolved and f.better]
        worse = [f for f in found if f.resolved and not f.better]
        if better:
            sentences.append(f"{where}, resolved better than the best uniform: {_listing(better)}.")
        else:
            sentences.append(f"{where}, no strategy is resolved better than the best uniform on any measure.")
        if worse:
            sentences.append(f"Resolved worse: {_listing(worse)}.")
        sentences.append(_unresolved(c, budget, found, level))
        sentences += _gap_to_recover(c, budget)
        memory = _memory(c, budget)
        if memory:
            sentences.append(memory)
    return sentences


def _listing(items: list[Finding]) -> str:
    items = sorted(items, key=lambda f: (f.measure == "kl", -abs(f.interval.estimate)))
    words = [f.text() for f in items[:SHOWN]]
    if len(items) > SHOWN:
        words.append(f"and {len(items) - SHOWN} more (in the table)")
    return "; ".join(words)


def _unresolved(c: Comparison, budget: float, found: list[Finding], level: float) -> str:
    open_ = [f for f in found if not f.resolved]
    level_pct = f"{100 * level:.0f} %"
    head = f"{len(open_)} of the {len(found)} comparisons are not resolved (their {level_pct} intervals contain 0)"
    if not open_:
        return f"All {len(found)} comparisons of a strategy with the best uniform are resolved."
    named, needs = [], []
    for suite in c.suites:
        scored = [f for f in open_ if f.suite == suite and f.measure == "score" and f.interval.estimate != 0]
        if not scored:
            continue
        best = max(scored, key=lambda f: f.interval.estimate)  # the strategy nearest to (or above) the best uniform
        n = _needed(c, best, level)
        named.append(best.text())
        needs.append(
            "an unknown number of" if n is None else f"about {n:,}" if n <= HOPELESS else f"more than {HOPELESS:,}"
        )
    if not named:
        return f"{head}."
    now = min(samples_per_task(f.row, c, f.suite) for f in open_)
    return (
        f"{head}; the best-placed strategy's score difference{'s' if len(named) > 1 else ''}, {' and '.join(named)}, "
        f"would likely need {' and '.join(needs)} samples per task to resolve (now {now}; normal-approximation "
        f"sample size for a paired mean difference at {100 * POWER:.0f} % power, from the observed variance of "
        "the per-sample differences)."
    )


def _needed(c: Comparison, f: Finding, level: float) -> int | None:
    ref = c.reference(f.row.run, f.row.budget, f.suite)
    bu = next((r for r in c.rows if r.name == ref.best_uniform and r.budget == f.row.budget), None)
    if bu is None:
        return None
    tasks = [t for t in f.row.scores if t.split("/")[0] == f.suite and t in bu.scores]
    arrays, _ = aligned([f.row, bu], tasks)
    return None if arrays is None else samples_to_resolve(arrays[0], arrays[1], level=level)


def samples_per_task(row: Row, c: Comparison, suite: str) -> int:
    counts = [len(ts.ids) for t, ts in row.samples.items() if t.split("/")[0] == suite]
    return min(counts) if counts else 0


def _gap_to_recover(c: Comparison, budget: float) -> list[str]:
    parts, open_ = [], []
    for suite in c.suites:
        ref = c.reference(0, budget, suite)
        if ref is None or ref.full_minus_uniform is None or not ref.best_uniform:
            continue
        d = ref.full_minus_uniform
        text = f"{suite} {d.estimate:+.1f} [{d.low:+.1f}, {d.high:+.1f}] over {ref.best_uniform}"
        bu = next((r for r in c.rows if r.name == ref.best_uniform and r.budget == budget), None)
        iv = None if bu is None else bu.suite_iv.get(suite)
        if iv is not None and iv.bounded:
            text += f" ({iv.estimate:.1f} [{iv.low:.1f}, {iv.high:.1f}])"
        (parts if d.low > 0 else open_).append(text)
    out = []
    if parts:
        out.append(f"FullKV is resolved above the best uniform on {'; '.join(parts)}: there is a gap to recover.")
    if open_:
        out.append(f"FullKV − best uniform is not resolved on {'; '.join(open_)}, so gap recovered is undefined there.")
    return out


def _memory(c: Comparison, budget: float) -> str | None:
    rows = [r for r in strategy_rows(c, budget) if r.kv_ratio is not None]
    full = next((r for r in c.rows if r.is_full and r.kv_mib is not None), None)
    if not rows:
        return None
    lo, hi = min(r.kv_ratio for r in rows), max(r.kv_ratio for r in rows)
    share = f"{100 * lo:.1f} %" if math.isclose(lo, hi, abs_tol=5e-4) else f"{100 * lo:.1f}–{100 * hi:.1f} %"
    text = f"The strategies hold {share} of FullKV's KV cache"
    if full is not None:
        mibs = [r.kv_mib for r in rows if r.kv_mib is not None]
        lo_mib, hi_mib = f"{min(mibs):.1f}", f"{max(mibs):.1f}"
        mib = lo_mib if lo_mib == hi_mib else f"{lo_mib}–{hi_mib}"
        text += f" ({mib} MiB against {full.kv_mib:.1f} MiB per sample)"
    return text + f", saving {100 * (1 - hi):.0f} % or more of its memory."
