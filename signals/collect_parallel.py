"""Fan-out of collection units: worker processes (joblib), cluster backends, the progress bar."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch
from joblib import Parallel, delayed, parallel_config
from rich.console import Console

from polykv_search.models import load_model
from polykv_search.progress import ProgressBar
from signals.collect_sample import sample_records
from signals.collect_settings import CollectError, Unit
from strategies import PHASES

#: joblib backends for ``jobs > 1`` ("sequential": the task path in-process, for tests).
BACKENDS = ("loky", "dask", "ray", "sequential")


@dataclass(frozen=True)
class ModelLoader:
    """A picklable recipe that loads the model in a worker process (``load_model`` arguments)."""

    name: str
    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"

    def __call__(self):
        return load_model(
            self.name, device=self.device, dtype=self.dtype, attn_implementation=self.attn_implementation
        )[0]


@dataclass(frozen=True)
class _GivenModel:
    """Ships an in-memory model to workers (fine for small models; use :class:`ModelLoader` otherwise)."""

    model: Any

    def __call__(self):
        return self.model


_WORKER_MODEL: dict[str, Any] = {}


def _worker_model(loader):
    key = repr(loader) if not isinstance(loader, _GivenModel) else f"given-{id(loader.model)}"
    if _WORKER_MODEL.get("key") != key:
        _WORKER_MODEL.clear()
        _WORKER_MODEL.update(key=key, model=loader())
    return _WORKER_MODEL["model"]


def _run_task(
    loader, context_ids, continuation_ids, index, units, settings, need_full, threads, scored=None
) -> list[dict]:
    if threads:
        torch.set_num_threads(threads)
    model = _worker_model(loader)
    return list(
        sample_records(model, context_ids, continuation_ids, index, units, settings, need_full=need_full, scored=scored)
    )


@contextlib.contextmanager
def _backend(backend: str | None, address: str | None, jobs: int = 1):
    # dask and ray are optional, heavy cluster backends: imported only when chosen
    if backend in (None, "loky", "sequential"):
        with parallel_config(backend=backend or "loky"):
            yield
        return
    if backend == "dask":
        try:
            from dask.distributed import Client
        except ImportError:
            raise CollectError("--backend dask needs dask.distributed (pip install 'dask[distributed]')") from None
        # no address: a local cluster of ``jobs`` single-threaded worker processes
        client = (
            Client(address)
            if address
            else Client(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None)
        )
        with client:
            with parallel_config(backend="dask"):
                yield
        return
    if backend == "ray":
        try:
            import ray
            from ray.util.joblib import register_ray
        except ImportError:
            raise CollectError("--backend ray needs ray (pip install 'ray[default]')") from None
        started = not ray.is_initialized()
        if started:
            ray.init(address=address, num_cpus=None if address else jobs, ignore_reinit_error=True)
        register_ray()
        try:
            with parallel_config(backend="ray"):
                yield
        finally:
            if started:
                ray.shutdown()
        return
    raise CollectError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")


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
    local = backend in (None, "loky", "sequential")
    threads = max(1, (os.cpu_count() or 1) // jobs) if backend in (None, "loky") else None
    tasks = []
    for s in sorted(per_sample):
        groups = _split(per_sample[s], jobs, num_layers) or [[]]
        for i, group in enumerate(groups):
            tasks.append((s, group, s in need_full and i == 0))
    sample_ids = {s: (list(samples[s].context_ids), list(samples[s].continuation_ids)) for s in per_sample}
    with _backend(backend, address, jobs):
        n_jobs = 1 if backend == "sequential" else (jobs if local else -1)
        results = Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
            delayed(_run_task)(loader, *sample_ids[s], s, group, settings, full, threads, spans[s] if spans else None)
            for s, group, full in tasks
        )
        for records in results:
            for rec in records:
                bar.advance(persist(rec))
