"""One function over calibration samples, in this process or fanned out over joblib workers (``collect
--jobs`` for the per-KV-head measurements: retrieval heads' cells are measured sample by sample).

A :class:`SampleMap` calls ``fn(model, sample, *args)`` for every sample and returns the results in the
samples' order. With ``jobs`` 1 and no backend it runs here on the given model; otherwise each sample is
one joblib task, and a worker loads the model once from the :class:`~polykv_search.parallel.ModelLoader`
(one thread per local worker, as ``collect`` and ``score`` do). Workers give the in-process results up to
the rounding of their one-thread matmuls (about 1e-6 relative on the default model's head cells; tested
against the in-process map).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from joblib import Parallel, delayed

from polykv_search.parallel import ModelLoader, joblib_backend, joblib_jobs, keep_worker, worker_threads
from signals.collect_parallel import worker_model
from signals.collect_settings import CollectError


def _run(loader: ModelLoader, threads: int | None, fn: Callable, sample, args: tuple) -> Any:
    keep_worker()
    if threads:
        torch.set_num_threads(threads)
    return fn(worker_model(loader), sample, *args)


@dataclass(frozen=True)
class SampleMap:
    """``fn(model, sample, *args)`` over samples: on ``model`` here, or over ``jobs`` workers on ``backend``
    (``loky`` by default; ``dask``/``ray`` at ``address``) that load the model from ``loader``."""

    model: Any = None
    loader: ModelLoader | None = None
    jobs: int = 1
    backend: str | None = None
    address: str | None = None

    @property
    def local(self) -> bool:
        """True when every sample runs in this process, on ``model``."""
        return (self.jobs == 1 and self.backend is None) or self.loader is None

    def __call__(
        self, fn: Callable, samples: Sequence, *args: Any, on_sample: Callable[[], None] | None = None
    ) -> list[Any]:
        """The results of ``fn`` for each of ``samples``, in order; ``on_sample`` after each one."""
        out = []
        if self.local:
            for sample in samples:
                out.append(fn(self.model, sample, *args))
                if on_sample is not None:
                    on_sample()
            return out
        threads = worker_threads(self.backend, self.jobs)
        with joblib_backend(self.backend, self.address, self.jobs, error=CollectError):
            for result in Parallel(n_jobs=joblib_jobs(self.backend, self.jobs), return_as="generator")(
                delayed(_run)(self.loader, threads, fn, sample, args) for sample in samples
            ):
                out.append(result)
                if on_sample is not None:
                    on_sample()
        return out
