"""The whole-model search's objective: per-sample KL(FullKV ‖ strategy) on calibration samples, journaled.

The measurement is the guard's (:func:`signals.strategy_kl.sample_kl`: the strategy applied to the whole
model, both phases, the continuation teacher-forced one token per call, the mean KL over each sample's
scored span) on samples drawn like the guard's (:func:`solvers.guard.guard_samples`: the table's
calibration split, never evaluation data). Each sample's FullKV reference is computed once, when a strategy
first needs it.

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
from signals.strategy_kl import check_layers, fullkv_reference, sample_kl
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

    Counts what it runs: ``runs`` (strategy × sample runs: one prefill, then the continuation one token per
    call), ``fullkv_runs`` (references), ``forward_calls`` (calls of the model's forward, kvzip's scoring
    passes included when they go through it) and ``seconds``. ``on_run`` is called after each run is journaled."""

    def __init__(self, model, samples: Sequence, journal: SearchJournal, *, on_run: Callable[[], None] | None = None):
        self.model = model
        self.samples = list(samples)
        self.kinds = ["evidence" if getattr(s, "scored", None) is not None else "prose" for s in self.samples]
        self.journal = journal
        self.on_run = on_run
        self.references: dict[int, Any] = {}
        self.runs = self.fullkv_runs = self.forward_calls = self.cached = 0
        self.seconds = 0.0

    def __call__(self, strategies: Sequence[Strategy]) -> np.ndarray:
        check_layers(self.model, strategies)
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
            "forward_calls": self.forward_calls,
            "values_from_journal": self.cached,
            "model_seconds": round(self.seconds, 3),
        }
