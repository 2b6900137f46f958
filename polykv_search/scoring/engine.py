"""Score entries on shared samples: the loop over tasks and samples, either engine, one record per entry."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
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
from polykv_search.heap import release_free_memory
from polykv_search.protocol import AGNOSTIC, check_protocol, split_prompt
from polykv_search.runtime import apply_strategy, model_spec, strategy_plans
from polykv_search.runtime.runtime import strategy_head_groups
from polykv_search.scoring import per_entry
from polykv_search.scoring.checkpoint import Checkpoint
from polykv_search.scoring.document import entry_record
from polykv_search.scoring.entries import Entry, ScoreError
from polykv_search.scoring.job import SampleJob
from polykv_search.scoring.shared import SharedScorer
from polykv_search.scoring.task_protocol import check_task_protocol
from strategies import Strategy

ENGINES = ("shared", "per-entry")
#: The most rows a batch cap (``batch_entries``, ``decode_batch``) takes: 1,024 rows of a 1,024-token prompt hold
#: 48 GB of SmolLM2-135M's float32 KV cache; a cap over that caps nothing on any one machine.
MAX_BATCH_ENTRIES = 1024


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
    fan_out: Callable | None = None,
    protocol: str = AGNOSTIC,
    decode_batch: int = 8,
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
        Also measure KL(FullKV ‖ entry) and ΔNLL on teacher-forced tasks (trajectory tasks, the decode
        suite, always measure them: they are what those tasks score).
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
    fan_out
        Runs the samples still to run elsewhere (``score --jobs``: :class:`~polykv_search.scoring.parallel.FanOut`),
        called with ``(entries, settings, pending, record)``, ``pending`` the costliest first by ``work``
        (:func:`longest_first`); ``record(task, index, sample, row)`` takes each finished sample in any order.
        None: one :class:`SampleRunner` in this process, in task order.
    protocol
        ``question-agnostic`` (the context call is compressed, the question follows uncompressed) or
        ``question-aware`` (context and question in one compressed call): :mod:`polykv_search.protocol`.
        Teacher-forced tasks have no question (the same under both); trajectory tasks are refused under
        ``question-aware`` (their question follows the generated tokens: :func:`check_task_protocol`).
    decode_batch
        Shared engine, trajectory tasks: samples of one prompt length decoded as one batch at most
        (:mod:`~polykv_search.scoring.trajectories`; the same results as one at a time).
    """
    if engine not in ENGINES:
        raise ScoreError(f"unknown scoring engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if not entries:
        raise ScoreError("nothing to score: no entries")
    num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    num_kv_heads = model_spec(model).num_kv_heads
    for entry in entries:
        entry.strategy.check_model(num_layers, num_kv_heads)
    try:
        check_protocol(protocol)
    except ValueError as err:
        raise ScoreError(str(err)) from None
    for task, _ in task_samples.values():
        check_task_protocol(task, protocol)
    settings = RunnerSettings(
        engine, batch_entries, decode_interval, interval_mode, max_new_tokens, fidelity, protocol, decode_batch
    )
    start = time.perf_counter()
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    pending = []
    for task, samples in task_samples.values():
        for index, sample in enumerate(samples):
            row = checkpoint.get(task.name, index, sample.id) if checkpoint is not None else None
            if row is None:
                pending.append((task, index, sample))
            else:
                rows[(task.name, index)] = row

    def record(task, index: int, sample, row: dict[str, Any]) -> None:
        rows[(task.name, index)] = row
        if checkpoint is not None:
            checkpoint.add(task.name, index, sample.id, row["rows"], row["wall"])
        if progress is not None and work is not None:
            progress(len(entries), work[(task.name, index)])
        elif progress is not None:
            progress(len(entries))

    if pending and fan_out is not None:
        fan_out(entries, settings, longest_first(pending, work), record)
    elif pending:
        with SampleRunner(model, tokenizer, entries, settings) as runner:
            for chunk in runner.chunks(pending):
                t0 = time.perf_counter()
                done = runner.run_many(chunk[0][0], [sample for _, _, sample in chunk])
                wall = (time.perf_counter() - t0) / len(chunk)  # a batch of samples: each its share
                for (task, index, sample), sample_rows in zip(chunk, done):
                    record(task, index, sample, {"rows": sample_rows, "wall": wall})
    results: list[list] = [[] for _ in entries]
    kv: list[list[float]] = [[] for _ in entries]
    full_kv: list[list[float]] = [[] for _ in entries]
    seconds = [0.0] * len(entries)
    for task, samples in task_samples.values():
        accs = [TaskAccumulator(task) for _ in entries]
        wall = 0.0
        for index in range(len(samples)):
            row = rows[(task.name, index)]
            wall += row["wall"]
            for i, r in enumerate(row["rows"]):
                accs[i].add(r["record"]["prediction"], r["record"])
                kv[i].append(r["record"]["kv_bytes"])
                full_kv[i].append(r["record"]["full_kv_bytes"])
                seconds[i] += r["seconds"]
        for i, acc in enumerate(accs):
            results[i].append(acc.result(samples, wall))
    if timing is not None:
        timing["total_s"] = time.perf_counter() - start
    return [
        entry_record(e, results[i], kv[i], full_kv[i], seconds[i] if engine == "per-entry" else None)
        for i, e in enumerate(entries)
    ]


def longest_first(pending: list, work: dict[tuple[str, int], float] | None) -> list:
    """``pending`` ``(task, index, sample)`` in decreasing ``work`` (ties and no ``work``: as given).

    Workers take samples in this order, so the last ones to start are the cheapest and the workers finish
    together: in task order a run's costliest task (ruler's cwe) came last, and one worker could finish a cwe
    sample alone while the other idled (the longest-processing-time-first rule of scheduling)."""
    if work is None:
        return list(pending)
    return sorted(pending, key=lambda p: -work[(p[0].name, p[1])])


@dataclass(frozen=True)
class RunnerSettings:
    """How a :class:`SampleRunner` runs samples (the ``score_entries`` arguments that shape a sample's rows)."""

    engine: str = "shared"
    batch_entries: int = 16
    decode_interval: int = 1
    interval_mode: str = "within"
    max_new_tokens: int | None = None
    fidelity: bool = True
    protocol: str = AGNOSTIC
    #: shared engine, trajectory tasks: samples of one prompt length decoded as one batch at most
    decode_batch: int = 8
    #: shared engine, trajectory tasks: FullKV generates alone before the entries (the reference path)
    fullkv_apart: bool = False


class SampleRunner:
    """Runs one sample at a time for every entry on one model (``with`` it: the shared engine applies its
    FullKV runtime for the block). The same code in this process and in a ``score --jobs`` worker."""

    def __init__(self, model, tokenizer, entries: Sequence[Entry], settings: RunnerSettings):
        self.model, self.tokenizer, self.entries, self.settings = model, tokenizer, list(entries), settings
        self.eos = frozenset(eos_token_ids(model, tokenizer))
        self.caller = _Caller(model)
        self.scorer: SharedScorer | None = None
        self._context: AbstractContextManager[Any] = nullcontext()

    def __enter__(self) -> SampleRunner:
        s = self.settings
        self._was_training = self.model.training
        self.model.eval()
        if s.engine == "shared":
            # one applied FullKV runtime for the engine's attention function and layer settings; the
            # per-entry path applies each entry's strategy itself
            L = self.model.config.get_text_config(decoder=True).num_hidden_layers
            self._context = apply_strategy(
                self.model, Strategy.full(L), decode_interval=s.decode_interval, interval_mode=s.interval_mode
            )
            runtime = self._context.__enter__()
            self.scorer, self._runs = shared_scorer(
                self.model,
                runtime,
                [e.strategy for e in self.entries],
                batch_entries=s.batch_entries,
                fullkv_apart=s.fullkv_apart,
            )
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._context.__exit__(*exc)
        finally:
            self.model.train(self._was_training)

    def chunks(self, pending: Sequence[tuple]) -> list[list[tuple]]:
        """``(task, index, sample)`` items cut into the calls of :meth:`run_many`: consecutive samples of one
        trajectory task, ``decode_batch`` at most, under the shared engine; else one sample each."""
        out: list[list[tuple]] = []
        size = self.settings.decode_batch if self.scorer is not None else 1
        for item in pending:
            last = out[-1] if out else None
            if last and last[0][0] is item[0] and item[0].kind == "trajectory" and len(last) < size:
                last.append(item)
            else:
                out.append([item])
        return out

    def run_many(self, task, samples: Sequence) -> list[list[dict[str, Any]]]:
        """The results rows of each of ``samples`` of ``task``: trajectory samples of one prompt length run
        as one batch under the shared engine (:meth:`SharedScorer.run_many`); else as :meth:`run`."""
        if self.scorer is None or task.kind != "trajectory" or len(samples) == 1:
            return [self.run(task, sample) for sample in samples]
        s, tok = self.settings, self.tokenizer
        jobs = [sample_job(tok, task, sample, self.eos, s.max_new_tokens, s.protocol) for sample in samples]
        out = []
        for sample, job, ran in zip(samples, jobs, self.scorer.run_many(jobs, samples=len(jobs))):
            outcomes = [ran[k] if first else copy.deepcopy(ran[k]) for k, first in self._runs]
            out.append(sample_rows(tok, task, sample, job, outcomes, shared=True))
        release_free_memory()
        return out

    def run(self, task, sample) -> list[dict[str, Any]]:
        """The results rows of ``sample`` of ``task``, one per entry."""
        s, tok = self.settings, self.tokenizer
        job = sample_job(tok, task, sample, self.eos, s.max_new_tokens, s.protocol)
        if self.scorer is not None:
            ran = self.scorer.run(job, fidelity=s.fidelity)
            outcomes = [ran[k] if first else copy.deepcopy(ran[k]) for k, first in self._runs]
        else:
            outcomes = per_entry.run_sample(
                self.model,
                self.entries,
                job,
                decode_interval=s.decode_interval,
                interval_mode=s.interval_mode,
                fidelity=s.fidelity,
                caller=self.caller,
            )
        rows = sample_rows(tok, task, sample, job, outcomes, shared=self.scorer is not None)
        release_free_memory()  # the sample's tensors are gone: without this the free heap grows all run
        return rows


def shared_scorer(
    model, runtime, strategies: Sequence[Strategy], *, batch_entries: int = 16, fullkv_apart: bool = False
) -> tuple[SharedScorer, list[tuple[int, bool]]]:
    """The shared engine for ``strategies`` under an applied (FullKV) ``runtime``, and which of its rows each
    strategy takes its outcome from (:func:`same_runs`): strategies that apply the same plans (e.g. two solvers
    that found one strategy) run as one row."""
    plans = [strategy_plans(s) for s in strategies]
    groups = [strategy_head_groups(s, runtime.spec.num_kv_heads) for s in strategies]
    runs, distinct = same_runs(list(zip(plans, groups)))
    scorer = SharedScorer(
        model,
        runtime,
        [plans[i] for i in distinct],
        batch_entries=batch_entries,
        head_groups=[groups[i] for i in distinct],
        fullkv_apart=fullkv_apart,
    )
    return scorer, runs


def same_runs(keys: list) -> tuple[list[tuple[int, bool]], list[int]]:
    """Entries whose ``keys`` (their plans and head groups) are equal run alike: which run each entry takes
    its outcome from, as ``(position among the distinct keys, whether it is that key's first entry)``, and
    the indices of the distinct keys' first entries, in order."""
    distinct: list[int] = []
    runs = []
    for i, key in enumerate(keys):
        k = next((n for n, d in enumerate(distinct) if keys[d] == key), len(distinct))
        runs.append((k, k == len(distinct)))
        if k == len(distinct):
            distinct.append(i)
    return runs, distinct


def sample_rows(tokenizer, task, sample, job: SampleJob, outcomes, *, shared: bool) -> list[dict[str, Any]]:
    """Per entry: the results file's record of one sample (KV bytes included) and the entry's own
    seconds (0 under the shared engine, where entries run together)."""
    rows = []
    for out in outcomes:
        if job.trajectory:  # with a question, the answer beside the trajectory's fidelity
            pred = dict(out.pred)
            if job.limit > 0:
                pred["answer"] = tokenizer.decode(out.new_ids, skip_special_tokens=True)
        elif job.teacher_forced:
            pred = out.pred
        else:
            pred = tokenizer.decode(out.new_ids, skip_special_tokens=True)
        record = sample_record(task, sample, pred, job.context_ids, job.question_ids, len(out.new_ids), out.timing)
        record["kv_bytes"], record["full_kv_bytes"] = out.kv_bytes, out.full_kv_bytes
        rows.append({"record": record, "seconds": 0.0 if shared else sum(out.timing.values())})
    return rows


def sample_job(
    tokenizer, task, sample, eos: frozenset[int], max_new_tokens: int | None, protocol: str = AGNOSTIC
) -> SampleJob:
    """The job of ``sample``: under ``question-aware`` a generating task's question joins the compressed
    context call (:func:`~polykv_search.protocol.split_prompt`); teacher-forced tasks feed no question."""
    check_task_protocol(task, protocol)
    context_ids, question_ids = encode_prompt(tokenizer, sample)
    if task.kind == "generate":
        context_ids, question_ids = split_prompt(context_ids, question_ids, protocol)
    if task.kind == "trajectory":
        return SampleJob(
            kind="trajectory",
            context_ids=context_ids,
            question_ids=question_ids,
            limit=generation_limit(task, sample, max_new_tokens) if question_ids else 0,
            eos=eos,
            generate_len=int(sample.meta["generate_len"]),
        )
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
