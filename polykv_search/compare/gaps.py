"""References, intervals, differences to the best uniform baseline and gap recovered.

Per run, budget and suite the reference is the best uniform single-pattern baseline (solver
``uniform``, highest suite score) and FullKV. Every row gets, from its per-sample records:

* the interval of each task score and suite score (stratified by task);
* the paired interval of its difference to the best uniform (same samples, same resamples);
* gap recovered ``(S - S_bestuniform) / (S_full - S_bestuniform)`` with its interval, undefined
  (a dash in the tables, the reason in a note) unless FullKV − best uniform is clearly positive;
* on teacher-forced tasks (version-2 results): KL(FullKV ‖ row), ΔNLL and the gap recovered on
  KL, ``(KL_u − KL) / KL_u`` against the uniform baseline with the lowest KL.

Without per-sample records (hand-written or truncated files) the point values remain and the gap
falls back to its point rule (defined when S_full > S_bestuniform).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from polykv_search import stats
from polykv_search.compare.model import Reference, Row, finite, fmt_budget, ordered
from polykv_search.stats import Gap, Interval


def gap_recovered(s_strategy: float | None, s_best_uniform: float | None, s_full: float | None) -> float | None:
    """(S_strategy − S_bestuniform) / (S_full − S_bestuniform); None when undefined: a missing score,
    or no gap to recover (the best uniform baseline ties with or beats FullKV, where the ratio's sign
    would flip)."""
    if s_strategy is None or s_best_uniform is None or s_full is None:
        return None
    if not all(math.isfinite(x) for x in (s_strategy, s_best_uniform, s_full)):
        return None
    if s_full <= s_best_uniform:
        return None
    return (s_strategy - s_best_uniform) / (s_full - s_best_uniform)


def best_uniform(rows: Sequence[Row], suite: str) -> Row | None:
    """The uniform baseline with the highest score on ``suite`` (first one on ties)."""
    best: Row | None = None
    for row in rows:
        s = row.suites.get(suite)
        if row.is_uniform and finite(s) and (best is None or s > best.suites[suite]):
            best = row
    return best


def best_uniform_kl(rows: Sequence[Row], suite: str) -> Row | None:
    """The uniform baseline with the lowest KL(FullKV ‖ ·) on ``suite`` (first one on ties)."""
    best: Row | None = None
    for row in rows:
        if row.is_uniform and suite in row.kl and (best is None or row.kl[suite].estimate < best.kl[suite].estimate):
            best = row
    return best


def aligned(
    rows: Sequence[Row], tasks: Sequence[str], measure: str = "score"
) -> tuple[list[list[np.ndarray]] | None, str | None]:
    """Per row, per task, the per-sample ``measure`` (in the records' common id order: pairing).

    Returns ``(arrays, None)``, or ``(None, reason)`` when a row lacks the task's records or the
    rows were scored on different sample ids.
    """
    if not tasks:
        return None, "no tasks"
    out: list[list[np.ndarray]] = [[] for _ in rows]
    for task in tasks:
        first = None
        for i, row in enumerate(rows):
            ts = row.samples.get(task)
            values = None if ts is None else ts.values(measure)
            if values is None:
                what = "per-sample scores" if measure == "score" else f"per-sample {measure}"
                return None, f"{row.name} has no {what} on {task}"
            if first is not None and ts.ids != first:
                return None, f"{rows[0].name} and {row.name} were scored on different samples of {task}"
            first = ts.ids
            out[i].append(np.asarray(values, dtype=float))
    return out, None


def compute_references(
    rows: list[Row],
    suites: list[str],
    suite_of: dict[str, str],
    n_runs: int,
    options: dict[str, Any],
    warnings: list[str],
) -> list[Reference]:
    """Fill every row's intervals, differences and gaps; return the references (run, budget, suite)."""
    for row in rows:
        _row_intervals(row, suites, suite_of, options)
    refs: list[Reference] = []
    for run in range(n_runs):
        full = next((r for r in rows if r.run == run and r.is_full), None)
        budgets = ordered(r.budget for r in rows if r.run == run and r.budget is not None)
        for budget in budgets:
            group = [r for r in rows if r.run == run and r.budget == budget]
            for suite in suites:
                tasks = _suite_tasks(group + ([full] if full else []), suite, suite_of)
                refs.append(_reference(run, budget, suite, tasks, group, full, options))
                _kl_reference(refs[-1], suite, suite_of, group, options)
    return refs


def _row_intervals(row: Row, suites: list[str], suite_of: dict[str, str], options: dict[str, Any]) -> None:
    for task, ts in row.samples.items():
        row.task_iv[task] = stats.mean_interval(ts.score, **options)
    for suite in suites:
        tasks = [t for t in row.scores if suite_of.get(t) == suite]
        if tasks and all(t in row.samples for t in tasks):
            row.suite_iv[suite] = stats.stratified_mean_interval([row.samples[t].score for t in tasks], **options)
        _bucket_intervals(row, suite, [t for t in tasks if t in row.samples], options)
        for measure, target in (("kl", row.kl), ("dnll", row.dnll)):
            with_measure = [t for t in tasks if t in row.samples and row.samples[t].values(measure) is not None]
            if with_measure:
                target[suite] = stats.stratified_mean_interval(
                    [row.samples[t].values(measure) for t in with_measure], **options
                )


def _bucket_intervals(row: Row, suite: str, tasks: list[str], options: dict[str, Any]) -> None:
    """Per position bucket, the KL interval over the suite's tasks that have that bucket (stratified)."""
    names = ordered(b for t in tasks for b in (row.samples[t].kl_buckets or {}))
    for name in names:
        strata = [row.samples[t].kl_buckets[name] for t in tasks if name in (row.samples[t].kl_buckets or {})]
        row.kl_buckets.setdefault(suite, {})[name] = stats.stratified_mean_interval(strata, **options)


def _suite_tasks(rows: Sequence[Row], suite: str, suite_of: dict[str, str]) -> list[str]:
    return ordered(t for r in rows for t in r.scores if suite_of.get(t) == suite)


def _reference(run, budget, suite, tasks, group, full, options) -> Reference:
    bu = best_uniform(group, suite)
    s_full = full.suites.get(suite) if full else None
    s_bu = bu.suites[suite] if bu else None
    ref = Reference(run, budget, suite, full.name if full else None, s_full, bu.name if bu else None, s_bu)
    where = f"{suite} at B={fmt_budget(budget)}"
    if full is None or not finite(s_full):
        ref.gap_note = f"no FullKV score on {suite}"
    elif bu is None:
        ref.gap_note = f"no uniform baseline at B={fmt_budget(budget)} on {suite}"
    else:
        arrays, _ = aligned([full, bu], tasks)
        if arrays is not None:
            ref.full_minus_uniform = stats.paired_difference_interval(arrays[0], arrays[1], **options)
            if not ref.full_minus_uniform.low > 0:
                ref.gap_note = (
                    f"FullKV − best uniform ({bu.name}) on {where} is not clearly positive: "
                    f"{_brief(ref.full_minus_uniform)}"
                )
        elif not s_full > s_bu:
            ref.gap_note = f"FullKV does not beat the best uniform ({bu.name}) on {where}"
    for row in group:
        _row_vs_reference(row, suite, tasks, ref, bu, full, options)
    return ref


def _row_vs_reference(
    row: Row, suite: str, tasks: list[str], ref: Reference, bu: Row | None, full: Row | None, options
) -> None:
    if suite not in row.suites:
        return
    if bu is None:
        row.diff[suite], row.diff_note[suite] = None, f"no uniform baseline on {suite}"
    elif row is bu:
        row.diff[suite], row.diff_note[suite] = None, "the best uniform baseline (reference)"
    else:
        arrays, why = aligned([row, bu], tasks)
        row.diff[suite] = None if arrays is None else stats.paired_difference_interval(arrays[0], arrays[1], **options)
        if why:
            row.diff_note[suite] = why
    if not ref.gap_defined:
        row.gap[suite] = None
        row.gap_iv[suite] = Gap(None, ref.gap_note, ref.full_minus_uniform)
        return
    row.gap[suite] = gap_recovered(row.suites.get(suite), ref.s_best_uniform, ref.s_full)
    if ref.full_minus_uniform is None:
        row.gap_iv[suite] = Gap(None, "no per-sample scores: no interval")
        return
    arrays, why = aligned([row, bu, full], tasks)
    if arrays is None:
        row.gap_iv[suite] = Gap(None, why, ref.full_minus_uniform)
    else:
        row.gap_iv[suite] = stats.gap_recovered_interval(*arrays, denominator=ref.full_minus_uniform, **options)


def _kl_reference(ref: Reference, suite: str, suite_of: dict[str, str], group: list[Row], options) -> None:
    if not any(suite in r.kl for r in group):
        return
    bu = best_uniform_kl(group, suite)
    if bu is None:
        ref.kl_gap_note = f"no uniform baseline with a KL on {suite}"
        return
    ref.kl_best_uniform, ref.kl_best = bu.name, bu.kl[suite]
    if not ref.kl_best.low > 0:
        ref.kl_gap_note = (
            f"the KL of the best uniform ({bu.name}) on {suite} is not clearly positive: {_brief(ref.kl_best, '.3g')}"
        )
    for row in group:
        if suite not in row.kl:
            continue
        if ref.kl_gap_note:
            row.kl_gap[suite] = Gap(None, ref.kl_gap_note, ref.kl_best)
            continue
        tasks = [
            t for t in row.scores if suite_of.get(t) == suite and row.samples.get(t) and row.samples[t].kl is not None
        ]
        arrays, why = aligned([row, bu], tasks, "kl")
        row.kl_gap[suite] = (
            Gap(None, why, ref.kl_best)
            if arrays is None
            else stats.kl_gap_interval(arrays[0], arrays[1], denominator=ref.kl_best, **options)
        )


def _brief(iv: Interval, spec: str = "+.1f") -> str:
    if not iv.bounded:
        return f"{iv.estimate:{spec}}, unbounded (a task has a single sample)"
    return f"{iv.estimate:{spec}}, {100 * iv.level:.0f}% interval [{iv.low:{spec}}, {iv.high:{spec}}]"
