"""The per-entry path (the reference): every entry runs every sample alone, from scratch.

Kept as the reference the shared engine is proven equal to (``score --no-shared-prefill``), and as
the plain use of the runtime: ``apply_strategy`` around the evaluation runner's own calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polykv_search.evaluation.fidelity import continuation_outcome, log_probs
from polykv_search.evaluation.runner import _Caller, greedy_generate, teacher_forced_logits
from polykv_search.evaluation.trajectory import TrajectoryMeter, forced_run, full_trajectory
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.scoring.entries import Entry
from polykv_search.scoring.job import SampleJob, SampleOutcome
from strategies import Strategy


def run_sample(
    model,
    entries: Sequence[Entry],
    job: SampleJob,
    *,
    decode_interval: int = 1,
    interval_mode: str = "within",
    fidelity: bool = True,
    caller=None,
) -> list[SampleOutcome]:
    """Run ``job`` once per entry, each inside its own ``apply_strategy``."""
    caller = caller or _Caller(model)
    if job.trajectory:
        settings = {"decode_interval": decode_interval, "interval_mode": interval_mode}
        return _run_trajectory(model, entries, job, caller, **settings)
    order = sorted(range(len(entries)), key=lambda i: not entries[i].strategy.is_full)  # FullKV first: the reference
    pred: Any  # the continuation outcome (teacher-forced) or the generated ids
    new: list[int]
    logits: Any  # teacher-forced: the continuation's logits; None otherwise
    reference = None
    if job.teacher_forced and fidelity and not entries[order[0]].strategy.is_full:
        with apply_strategy(model, Strategy.full(entries[0].strategy.num_layers), decode_interval=decode_interval):
            logits, _ = teacher_forced_logits(model, job.context_ids, job.targets, caller, stepwise=job.stepwise)
        reference = log_probs(logits)
    outcomes: list[SampleOutcome | None] = [None] * len(entries)
    for i in order:
        with apply_strategy(
            model, entries[i].strategy, decode_interval=decode_interval, interval_mode=interval_mode
        ) as rt:
            if job.teacher_forced:
                logits, timing = teacher_forced_logits(
                    model, job.context_ids, job.targets, caller, stepwise=job.stepwise
                )
                if fidelity and reference is None:  # the FullKV entry, run first
                    reference = log_probs(logits)
                pred, new = continuation_outcome(logits, job.targets, reference if fidelity else None), []
            else:
                logits = None
                new, timing = greedy_generate(model, job.context_ids, job.question_ids, job.limit, job.eos, caller)
                pred = new
            report = rt.report()
        outcomes[i] = SampleOutcome(pred, timing, report.kv_bytes, report.full_kv_bytes, list(new), logits)
    return outcomes  # type: ignore[return-value]


def _run_trajectory(model, entries: Sequence[Entry], job: SampleJob, caller, **settings) -> list[SampleOutcome]:
    """FullKV generates the trajectory once (its outcome is every FullKV entry's); every other entry is
    teacher-forced along it inside its own ``apply_strategy``."""
    num_layers = entries[0].strategy.num_layers
    with apply_strategy(model, Strategy.full(num_layers), **settings) as rt:
        trajectory = full_trajectory(caller, job.context_ids, job.generate_len, job.eos, job.question_ids, job.limit)
        full = rt.report()
    outcomes = []
    for entry in entries:
        if not entry.strategy.has_head_groups and all(
            not p.evicts and not d.evicts for p, d in strategy_plans(entry.strategy)
        ):  # FullKV (a layer split into head groups has a FULL_PLAN in strategy_plans)
            pred, new = TrajectoryMeter.exact(trajectory), list(trajectory.answer_ids)
            outcomes.append(SampleOutcome(pred, trajectory.timing, full.kv_bytes, full.full_kv_bytes, new))
            continue
        with apply_strategy(model, entry.strategy, **settings) as rt:
            pred, new, timing = forced_run(caller, trajectory, job.context_ids, job.eos, job.question_ids, job.limit)
            report = rt.report()
        outcomes.append(SampleOutcome(pred, timing, report.kv_bytes, report.full_kv_bytes, new))
    return outcomes
