"""``score --jobs N``: the samples still to run, fanned out over joblib workers (local processes, or a dask
or ray cluster), each worker a full scoring engine.

One task per sample. A worker loads the model once from a :class:`~polykv_search.parallel.ModelLoader`
(``--device cuda`` on a machine with several GPUs: one GPU per worker process) and keeps one
:class:`~polykv_search.scoring.engine.SampleRunner` for as long as it gets samples of the same run. Rows
come back as samples finish, in any order; the parent writes each to the run's checkpoint (so a stopped
distributed run resumes like any other) and advances the progress bar. The merged results equal a
one-process run's, but for wall times (tested on loky and on a local dask cluster).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from joblib import Parallel, delayed

from polykv_search.parallel import ModelLoader, joblib_backend, joblib_jobs, keep_worker, worker_threads
from polykv_search.scoring.engine import RunnerSettings, SampleRunner
from polykv_search.scoring.entries import Entry, ScoreError

_WORKER: dict[str, Any] = {}


def _runner(loader: ModelLoader, entries: Sequence[Entry], settings: RunnerSettings) -> SampleRunner:
    key = repr((loader, [(e.name, e.kind, e.strategy.digest()) for e in entries], settings))
    if _WORKER.get("key") != key:
        release_worker()
        model, tokenizer = loader.on_own_device().load()
        runner = SampleRunner(model, tokenizer, entries, settings).__enter__()
        _WORKER.update(key=key, runner=runner)
    return _WORKER["runner"]


def release_worker() -> None:
    """Leave this process's cached runner (its model's runtime is removed)."""
    runner = _WORKER.pop("runner", None)
    _WORKER.clear()
    if runner is not None:
        runner.__exit__(None, None, None)


def _run_sample(loader, entries, settings, threads, task, index, sample) -> tuple[str, int, dict[str, Any]]:
    keep_worker()
    if threads:
        torch.set_num_threads(threads)
    runner = _runner(loader, entries, settings)
    start = time.perf_counter()
    rows = runner.run(task, sample)
    return task.name, index, {"rows": rows, "wall": time.perf_counter() - start}


class FanOut:
    """The ``fan_out`` of :func:`~polykv_search.scoring.engine.score_entries` for ``jobs`` workers on ``backend``."""

    def __init__(self, loader: ModelLoader, jobs: int, backend: str | None = None, address: str | None = None):
        self.loader, self.jobs, self.backend, self.address = loader, jobs, backend, address

    def __call__(self, entries: Sequence[Entry], settings: RunnerSettings, pending: list, record: Callable) -> None:
        n_jobs = joblib_jobs(self.backend, self.jobs)
        threads = worker_threads(self.backend, self.jobs)
        where = {(task.name, index): (task, index, sample) for task, index, sample in pending}
        try:
            with joblib_backend(self.backend, self.address, self.jobs, error=ScoreError):
                results = Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
                    delayed(_run_sample)(self.loader, list(entries), settings, threads, task, index, sample)
                    for task, index, sample in pending
                )
                for name, index, row in results:
                    record(*where[(name, index)], row)
        finally:
            if self.backend == "sequential":  # the "worker" was this process
                release_worker()
