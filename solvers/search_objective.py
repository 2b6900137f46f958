"""The whole-model search's objective: per-sample KL(FullKV ‖ strategy) on calibration samples, journaled.

The measurement is the guard's (:func:`signals.strategy_kl.sample_kl`: the strategy applied to the whole
model, both phases, the continuation teacher-forced one token per call, the mean KL over each sample's
scored span) on samples drawn like the guard's (:func:`solvers.guard.guard_samples`: the table's
calibration split, never evaluation data). Each sample's FullKV reference is computed once, when a strategy
first needs it.

By default (``batched``) every strategy of one call that the journal does not hold is measured on a sample at
once, by the scoring engine (:func:`signals.strategy_kl.batched_sample_kl`: one FullKV context pass, kvzip's
reconstruction pass once, the continuations of all strategies one batch, one token per call; the first call
of a sample also holds its FullKV reference row); ``batched=False`` runs each (strategy, sample) alone (the
reference path, :func:`signals.strategy_kl.sample_kl`). The two give the same values within float rounding
(tests/test_search_batched.py), so a journal written by either resumes with the other.

Every (strategy, sample) value is appended to a :class:`SearchJournal` (JSON lines, flushed and fsynced per
record, keyed by the strategy's :meth:`~strategies.Strategy.digest`), so a rerun after a kill evaluates
nothing twice; a journal made with other samples or another model is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from signals.journal import Journal
from signals.strategy_kl import batched_sample_kl, check_layers, fullkv_reference, sample_kl
from strategies import Strategy

#: Version of the measurement's definition; a journal of another version is refused.
DEFINITION = "kl-scored-span-stepwise-v1"


class SearchJournal(Journal):
    """The values of evaluated strategies: ``{"kind": "kl", "digest": ..., "sample": i, "kl": v}`` per line."""

    format = "polykv-search-journal"
    version = 1
    what = "search journal"
    key_fields = {
        "model": "model",
        "model_fingerprint": "model (architecture/config)",
        "samples": "calibration samples",
        "definition": "objective (code version)",
    }

    def __init__(self, path, key: Mapping[str, Any]):
        super().__init__(path, key)
        self.values: dict[tuple[str, int], float] = {}

    @property
    def resumed(self) -> bool:
        return bool(self.values)

    def _remember(self, rec: dict) -> None:
        if rec.get("kind") == "kl":
            self.values[(str(rec["digest"]), int(rec["sample"]))] = float(rec["kl"])


class WholeModelObjective:
    """``objective(strategies) -> [n_samples, len(strategies)]`` per-sample KL, from the journal where known.

    Counts what it runs: ``runs`` ((strategy, sample) values measured), ``fullkv_runs`` (references),
    ``batches`` (batched calls: one per sample and call of the objective that measures anything),
    ``forward_calls`` (calls of the model's forward, kvzip's scoring passes included when they go through it)
    and ``seconds``. ``on_run`` is called after each value is journaled. ``batched``: measure a call's strategies
    on each sample at once (up to ``batch_entries`` continuation rows a batch), else one at a time."""

    def __init__(
        self,
        model,
        samples: Sequence,
        journal: SearchJournal,
        *,
        on_run: Callable[[], None] | None = None,
        batched: bool = True,
        batch_entries: int = 16,
    ):
        self.model = model
        self.samples = list(samples)
        self.kinds = ["evidence" if getattr(s, "scored", None) is not None else "prose" for s in self.samples]
        self.journal = journal
        self.on_run = on_run
        self.batched, self.batch_entries = batched, batch_entries
        self.references: dict[int, Any] = {}
        self.runs = self.fullkv_runs = self.forward_calls = self.cached = self.batches = 0
        self.seconds = 0.0

    def __call__(self, strategies: Sequence[Strategy]) -> np.ndarray:
        check_layers(self.model, strategies)
        if self.batched:
            return self._batched(strategies)
        out = np.empty((len(self.samples), len(strategies)), dtype=np.float64)
        for j, strategy in enumerate(strategies):
            digest = strategy.digest()
            for i, sample in enumerate(self.samples):
                value = self.journal.values.get((digest, i))
                if value is None:
                    value = self._run(strategy, i, sample)
                    self.journal.add({"kind": "kl", "digest": digest, "sample": i, "kl": value})
                    if self.on_run is not None:
                        self.on_run()
                else:
                    self.cached += 1
                out[i, j] = value
        return out

    def _batched(self, strategies: Sequence[Strategy]) -> np.ndarray:
        """Per sample, the strategies the journal does not hold (each digest once) in one batched call."""
        digests = [s.digest() for s in strategies]
        out = np.empty((len(self.samples), len(strategies)), dtype=np.float64)
        for i, sample in enumerate(self.samples):
            todo = {d: s for d, s in zip(digests, strategies) if (d, i) not in self.journal.values}
            if todo:
                for digest, value in zip(todo, self._run_batch(list(todo.values()), i, sample)):
                    self.journal.add({"kind": "kl", "digest": digest, "sample": i, "kl": value})
                    if self.on_run is not None:
                        self.on_run()
            self.cached += len(digests) - len(todo)
            out[i] = [self.journal.values[(d, i)] for d in digests]
        return out

    def _run_batch(self, strategies: list[Strategy], i: int, sample) -> list[float]:
        start = time.perf_counter()
        handle = self.model.register_forward_pre_hook(self._count)
        try:
            values, reference = batched_sample_kl(
                self.model, sample, strategies, self.references.get(i), batch_entries=self.batch_entries
            )
        finally:
            handle.remove()
        if i not in self.references:
            self.references[i] = reference
            self.fullkv_runs += 1
        self.runs += len(strategies)
        self.batches += 1
        self.seconds += time.perf_counter() - start
        return values

    def _run(self, strategy: Strategy, i: int, sample) -> float:
        start = time.perf_counter()
        handle = self.model.register_forward_pre_hook(self._count)
        try:
            if i not in self.references:
                self.references[i] = fullkv_reference(self.model, sample)
                self.fullkv_runs += 1
            value = sample_kl(self.model, sample, strategy, self.references[i])
        finally:
            handle.remove()
        self.runs += 1
        self.seconds += time.perf_counter() - start
        return value

    def _count(self, module, args) -> None:
        self.forward_calls += 1

    def cost(self) -> dict[str, Any]:
        return {
            "strategy_runs": self.runs,
            "fullkv_runs": self.fullkv_runs,
            "batched_calls": self.batches,
            "forward_calls": self.forward_calls,
            "values_from_journal": self.cached,
            "model_seconds": round(self.seconds, 3),
        }
