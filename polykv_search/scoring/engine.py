"""Score entries on shared samples: the loop over tasks and samples, either engine, one record per entry."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

from polykv_search.evaluation.runner import (
    TaskAccumulator,
    _Caller,
    continuation_ids,
    eos_token_ids,
    generation_limit,
    sample_record,
)
from polykv_search.evaluation.samples import encode_prompt
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.scoring import per_entry
from polykv_search.scoring.checkpoint import Checkpoint
from polykv_search.scoring.document import entry_record
from polykv_search.scoring.entries import Entry, ScoreError
from polykv_search.scoring.job import SampleJob
from polykv_search.scoring.shared import SharedScorer
from strategies import Strategy

ENGINES = ("shared", "per-entry")


def score_entries(
    model,
    tokenizer,
    entries: Sequence[Entry],
    task_samples: dict[str, tuple[Any, list]],
    *,
    engine: str = "shared",
    batch_entries: int = 16,
    decode_interval: int = 1,
    interval_mode: str = "within",
    max_new_tokens: int | None = None,
    fidelity: bool = True,
    progress: Callable[..., None] | None = None,
    timing: dict[str, float] | None = None,
    checkpoint: Checkpoint | None = None,
    work: dict[tuple[str, int], float] | None = None,
) -> list[dict[str, Any]]:
    """Run every task's samples for every entry; returns the entries' records for the results file.

    Parameters
    ----------
    engine
        ``"shared"``: one FullKV context pass per sample, entries batched (:mod:`~polykv_search.scoring.shared`);
        ``"per-entry"``: each entry runs each sample alone (the reference, :mod:`~polykv_search.scoring.per_entry`).
        Both give the same kept tokens, predictions and scores.
    batch_entries
        Shared engine: entries decoded in one batch at most.
    fidelity
        Also measure KL(FullKV ‖ entry) and ΔNLL on teacher-forced tasks.
    progress
        Called with the number of (entry, sample) units just run (not for samples replayed from
        ``checkpoint``); with ``work``, called as ``progress(units, work[(task, index)])``.
    timing
        If given, filled with the run's wall seconds (``total_s``) and per-phase sums.
    checkpoint
        Finished samples found there are replayed, not run; each sample run is added to it.
    work
        Per (task name, sample index), the sample's cost (:func:`~polykv_search.scoring.cost.sample_cost`),
        passed on to ``progress`` so that the time left can weigh what remains.
    """
    if engine not in ENGINES:
        raise ScoreError(f"unknown scoring engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if not entries:
        raise ScoreError("nothing to score: no entries")
    num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    for entry in entries:
        entry.strategy.check_model(num_layers)
    eos = frozenset(eos_token_ids(model, tokenizer))
    caller = _Caller(model)
    results: list[list] = [[] for _ in entries]
    kv: list[list[float]] = [[] for _ in entries]
    full_kv: list[list[float]] = [[] for _ in entries]
    seconds = [0.0] * len(entries)
    start = time.perf_counter()

    def run_one(task, sample, scorer) -> list[dict[str, Any]]:
        job = sample_job(tokenizer, task, sample, eos, max_new_tokens)
        if scorer is not None:
            return sample_rows(tokenizer, task, sample, job, scorer.run(job, fidelity=fidelity), shared=True)
        outcomes = per_entry.run_sample(
            model, entries, job, decode_interval=decode_interval, interval_mode=interval_mode, fidelity=fidelity,
            caller=caller,
        )  # fmt: skip
        return sample_rows(tokenizer, task, sample, job, outcomes, shared=False)

    was_training = model.training
    model.eval()
    # the shared engine runs under one applied FullKV runtime (for its attention function and layer
    # settings); the per-entry path applies each entry's strategy itself
    shared = (
        apply_strategy(model, Strategy.full(num_layers), decode_interval=decode_interval, interval_mode=interval_mode)
        if engine == "shared"
        else nullcontext()
    )
    try:
        with shared as runtime:
            scorer = None
            if engine == "shared":
                plans = [strategy_plans(e.strategy) for e in entries]
                scorer = SharedScorer(model, runtime, plans, batch_entries=batch_entries)
            for task, samples in task_samples.values():
                accs = [TaskAccumulator(task) for _ in entries]
                wall = 0.0
                for index, sample in enumerate(samples):
                    row = checkpoint.get(task.name, index, sample.id) if checkpoint is not None else None
                    if row is None:
                        t0 = time.perf_counter()
                        rows = run_one(task, sample, scorer)
                        row = {"rows": rows, "wall": time.perf_counter() - t0}
                        if checkpoint is not None:
                            checkpoint.add(task.name, index, sample.id, row["rows"], row["wall"])
                        if progress is not None and work is not None:
                            progress(len(entries), work[(task.name, index)])
                        elif progress is not None:
                            progress(len(entries))
                    wall += row["wall"]
                    for i, r in enumerate(row["rows"]):
                        accs[i].add(r["record"]["prediction"], r["record"])
                        kv[i].append(r["record"]["kv_bytes"])
                        full_kv[i].append(r["record"]["full_kv_bytes"])
                        seconds[i] += r["seconds"]
                for i, acc in enumerate(accs):
                    results[i].append(acc.result(samples, wall))
    finally:
        model.train(was_training)
    if timing is not None:
        timing["total_s"] = time.perf_counter() - start
    return [
        entry_record(e, results[i], kv[i], full_kv[i], seconds[i] if engine == "per-entry" else None)
        for i, e in enumerate(entries)
    ]


def sample_rows(tokenizer, task, sample, job: SampleJob, outcomes, *, shared: bool) -> list[dict[str, Any]]:
    """Per entry: the results file's record of one sample (KV bytes included) and the entry's own
    seconds (0 under the shared engine, where entries run together)."""
    rows = []
    for out in outcomes:
        pred = out.pred if job.teacher_forced else tokenizer.decode(out.new_ids, skip_special_tokens=True)
        record = sample_record(task, sample, pred, job.context_ids, job.question_ids, len(out.new_ids), out.timing)
        record["kv_bytes"], record["full_kv_bytes"] = out.kv_bytes, out.full_kv_bytes
        rows.append({"record": record, "seconds": 0.0 if shared else sum(out.timing.values())})
    return rows


def sample_job(tokenizer, task, sample, eos: frozenset[int], max_new_tokens: int | None) -> SampleJob:
    context_ids, question_ids = encode_prompt(tokenizer, sample)
    forced = task.kind == "teacher_forced"
    return SampleJob(
        kind=task.kind,
        context_ids=context_ids,
        question_ids=question_ids,
        target_ids=continuation_ids(sample) if forced else None,
        limit=0 if forced else generation_limit(task, sample, max_new_tokens),
        eos=eos,
    )


def score_entry(
    model,
    tokenizer,
    entry: Entry,
    task_samples: dict[str, tuple[Any, list]],
    *,
    decode_interval: int = 1,
    max_new_tokens: int | None = None,
    fidelity: bool = False,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Score one entry (the Optuna solver's trial scorer); ``fidelity`` off: no FullKV reference row."""
    return score_entries(
        model,
        tokenizer,
        [entry],
        task_samples,
        decode_interval=decode_interval,
        max_new_tokens=max_new_tokens,
        fidelity=fidelity,
        progress=(lambda n: progress()) if progress else None,
    )[0]
