"""Fan-out of collection units: worker processes (joblib), cluster backends, the progress bar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from joblib import Parallel, delayed
from rich.console import Console

from polykv_search.parallel import (  # noqa: F401
    BACKENDS,
    ModelLoader,
    joblib_backend,
    joblib_jobs,
    keep_worker,
    worker_threads,
)
from polykv_search.progress import ProgressBar
from signals.collect_sample import sample_records
from signals.collect_settings import CollectError, Unit
from strategies import PHASES


@dataclass(frozen=True)
class _GivenModel:
    """Ships an in-memory model to workers (fine for small models; use :class:`ModelLoader` otherwise)."""

    model: Any

    def __call__(self):
        return self.model


_WORKER_MODEL: dict[str, Any] = {}


def worker_model(loader):
    """The model ``loader`` gives, loaded once per worker process (and again for another loader)."""
    key = repr(loader) if not isinstance(loader, _GivenModel) else f"given-{id(loader.model)}"
    if _WORKER_MODEL.get("key") != key:
        _WORKER_MODEL.clear()
        _WORKER_MODEL.update(key=key, model=loader())
    return _WORKER_MODEL["model"]


def _run_task(
    loader, context_ids, continuation_ids, index, units, settings, need_full, threads, scored=None
) -> list[dict]:
    keep_worker()
    if threads:
        torch.set_num_threads(threads)
    model = worker_model(loader)
    return list(
        sample_records(model, context_ids, continuation_ids, index, units, settings, need_full=need_full, scored=scored)
    )


def _backend(backend: str | None, address: str | None, jobs: int = 1):
    return joblib_backend(backend, address, jobs, error=CollectError)


def _split(units: list[Unit], parts: int, num_layers: int) -> list[list[Unit]]:
    """Greedy split into ``parts`` groups of similar cost (a unit's cost ~ layers above it)."""
    parts = max(1, min(parts, len(units)))
    groups: list[list[Unit]] = [[] for _ in range(parts)]
    loads = [0.0] * parts
    for unit in sorted(units, key=lambda u: -(num_layers - u.layer)):
        i = loads.index(min(loads))
        groups[i].append(unit)
        loads[i] += num_layers - unit.layer + 2
    return [sorted(g, key=lambda u: (u.layer, PHASES.index(u.phase))) for g in groups if g]


# ----------------------------------------------------------------------------- progress
class Progress(ProgressBar):
    """Collection progress on stderr (a bar in a terminal, plain lines in a log); ``enabled=False``: none."""

    def __init__(self, enabled: bool, total: int, done: int, description: str):
        super().__init__(
            Console(stderr=True) if enabled else None, description, total, completed=done, unit="cells×samples"
        )


def run_parallel(
    samples, per_sample, need_full, settings, jobs, backend, address, loader, num_layers, persist, bar, spans=None
) -> None:
    """Run every pending unit through joblib; ``spans[s]``: sample s's scored continuation positions."""
    threads = worker_threads(backend, jobs)
    tasks = []
    for s in sorted(per_sample):
        groups = _split(per_sample[s], jobs, num_layers) or [[]]
        for i, group in enumerate(groups):
            tasks.append((s, group, s in need_full and i == 0))
    sample_ids = {s: (list(samples[s].context_ids), list(samples[s].continuation_ids)) for s in per_sample}
    with _backend(backend, address, jobs):
        results = Parallel(n_jobs=joblib_jobs(backend, jobs), return_as="generator_unordered")(
            delayed(_run_task)(loader, *sample_ids[s], s, group, settings, full, threads, spans[s] if spans else None)
            for s, group, full in tasks
        )
        for records in results:
            for rec in records:
                bar.advance(persist(rec))
