"""A loky worker that keeps a model between tasks is not replaced when its memory grows.

loky replaces a worker whose memory grew by 300 MB since its first task (it takes it for a leak); a
``score --jobs`` or ``collect --jobs`` worker holds a model and buffers that follow the longest sample, so
it calls :func:`polykv_search.parallel.keep_worker` first. Each task here holds 350 MB more and reports
its process id: the same two workers serve every task only when they call it.
"""

from __future__ import annotations

import os
import time

import pytest
from joblib.externals.loky import ProcessPoolExecutor, process_executor

pytestmark = pytest.mark.skipif(not process_executor._USE_PSUTIL, reason="loky checks memory only with psutil")

_HELD: list[bytes] = []


def _grow(keep: bool) -> int:
    if keep:  # imported here: a worker of the other test starts without torch's import time
        from polykv_search.parallel import keep_worker

        keep_worker()
    _HELD.append(b"\1" * (350 << 20))  # written, so resident
    time.sleep(1.1)  # loky checks a worker's memory at most once a second
    return os.getpid()


def _workers_seen(keep: bool) -> set[int]:
    with ProcessPoolExecutor(max_workers=2) as pool:
        return set(pool.map(_grow, [keep] * 6))


def test_without_it_loky_replaces_a_worker_whose_memory_grew():
    assert len(_workers_seen(keep=False)) > 2  # the check this test relies on does happen


def test_a_worker_that_calls_keep_worker_serves_every_task():
    assert len(_workers_seen(keep=True)) <= 2


def test_joblib_jobs_and_worker_threads_follow_the_backend(monkeypatch):
    from polykv_search import parallel

    monkeypatch.setattr(parallel, "usable_cores", lambda: 8)
    assert [parallel.joblib_jobs(b, 3) for b in ("sequential", None, "loky", "dask", "ray")] == [1, 3, 3, -1, -1]
    assert parallel.worker_threads("loky", 3) == 2 and parallel.worker_threads(None, 16) == 1
    assert parallel.worker_threads("dask", 3) is None  # cluster workers keep their own
