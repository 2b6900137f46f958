"""Fan-out through joblib, shared by ``collect`` and ``score``: the backends, a picklable model recipe, and
one accelerator per worker.

Backends: ``loky`` (local processes, the default), ``dask`` (a ``dask.distributed`` scheduler at
``address``, or a local cluster of ``jobs`` processes), ``ray`` (a cluster at ``address``, or a local
one), and ``sequential`` (the task path in this process, for tests). dask and ray are optional and
imported only when chosen.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from joblib import parallel_config

BACKENDS = ("loky", "dask", "ray", "sequential")


@dataclass(frozen=True)
class ModelLoader:
    """A picklable recipe that loads the model in a worker process (``load_model`` arguments).

    Calling it returns the model; :meth:`load` returns ``(model, tokenizer)``."""

    name: str
    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"

    def load(self):
        from transformers.utils import logging as hf_logging

        from polykv_search.models import load_model  # here: importing this module stays light (torch-free)

        hf_logging.disable_progress_bar()  # a worker's load is not the user's business: no bar per worker
        return load_model(self.name, device=self.device, dtype=self.dtype, attn_implementation=self.attn_implementation)

    def __call__(self):
        return self.load()[0]

    def on_own_device(self) -> ModelLoader:
        """This recipe with ``device="cuda"`` narrowed to the accelerator this worker process claimed
        (:func:`claim_device`); any other device unchanged."""
        return replace(self, device=claim_device(self.device))


_CLAIMED: dict[str, object] = {}


def claim_device(device: str) -> str:
    """``"cuda"`` on a machine with several GPUs: ``"cuda:i"`` for the first ``i`` no other process on this
    machine has claimed (a lock file per GPU, held while the process lives), so that ``jobs`` workers get
    one GPU each; ``"cuda:0"`` again for workers beyond the GPU count. Any other device: unchanged."""
    import torch

    if device != "cuda" or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return device
    if "device" in _CLAIMED:
        return str(_CLAIMED["device"])
    folder = Path(tempfile.gettempdir()) / f"polykv-gpu-claims-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    for i in range(torch.cuda.device_count()):
        handle = open(folder / f"cuda-{i}.lock", "w")  # noqa: SIM115 - held open: the lock lives with the process
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _CLAIMED.update(device=f"cuda:{i}", handle=handle)
        return f"cuda:{i}"
    return "cuda:0"


@contextlib.contextmanager
def joblib_backend(backend: str | None, address: str | None, jobs: int = 1, error: type[Exception] = ValueError):
    """Run the ``with`` body's ``joblib.Parallel`` calls on ``backend`` (see the module docstring);
    a missing optional package or an unknown backend raises ``error`` with one line."""
    if backend == "sequential":
        with parallel_config(backend=backend):
            yield
        return
    if backend in (None, "loky"):  # each worker ignores Ctrl-C and ends with this process (:func:`follow_parent`)
        with parallel_config(backend="loky", initializer=follow_parent, initargs=(os.getpid(),)), quiet_interrupt():
            yield
        return
    if backend == "dask":
        try:
            from dask.distributed import Client
        except ImportError:
            raise error("--backend dask needs dask.distributed (pip install 'dask[distributed]')") from None
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
            raise error("--backend ray needs ray (pip install 'ray[default]')") from None
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
    raise error(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")


#: seconds between a local worker's checks that the process that started it is alive
PARENT_POLL = 0.25


def follow_parent(parent: int, poll: float = PARENT_POLL) -> None:
    """loky's worker initializer: the worker ignores Ctrl-C and ends within ``poll`` seconds of ``parent``.

    Ctrl-C reaches a terminal's whole process group; the parent alone answers it (it stops its workers and says
    where the finished work is), so a worker must not die of it first (joblib would then warn of a worker that
    stopped). A parent killed outright (SIGKILL, the OOM killer) cannot stop its workers: loky keeps an idle worker
    for 5 minutes and a busy one until its task ends, holding a model each, and loky's resource trackers live as
    long as any worker does. A daemon thread here polls ``os.getppid()``, which changes the moment the parent dies
    (the worker is re-parented), and ends the process; portable, unlike Linux's ``PR_SET_PDEATHSIG`` (which fires
    when the *thread* that spawned the worker ends, and loky spawns replacement workers from a helper thread)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    start = os.getppid()
    if start != parent and not _alive(parent):  # the parent died before this worker got here
        os._exit(1)

    def watch() -> None:
        while os.getppid() == start:
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="polykv-follow-parent", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds the number
        return True
    return True


@contextlib.contextmanager
def quiet_interrupt():
    """After Ctrl-C in the ``with`` body, joblib's warnings are off for the rest of this (ending) process.

    joblib and loky tear workers down in their own threads, after the interrupt has left the body, and warn of
    jobs that were pending or workers that stopped: which is what an interrupt means. The one line the CLI prints
    says what is kept. joblib's notice of cancelled tasks comes earlier, while the interrupt unwinds the loop that
    iterates its results (before this context's exit), so it is filtered for the whole body: tasks are only ever
    cancelled here by an interrupt or an error, which the CLI reports itself."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*tasks which were still being processed", category=UserWarning)
            yield
    except KeyboardInterrupt:
        warnings.filterwarnings("ignore", module=r"joblib(\.|$)")
        raise


#: loky's limit on a worker's memory growth, raised to this in workers that keep a model (:func:`keep_worker`)
NO_LEAK_LIMIT = 1 << 62


def keep_worker() -> None:
    """Keep this loky worker alive however its memory grows: call it in the task of a worker that caches a
    model between tasks.

    loky takes a worker whose memory grew by 300 MB since its first task for a leaking one and replaces it
    (``UserWarning: A worker stopped while some jobs were given to the executor``). A worker here holds a model
    and, for ``score``, a runner whose buffers follow the longest sample so far, so under that rule it was
    replaced every minute or two and loaded its model again (measured on ``score --jobs 2``: both workers
    replaced every 1.5-2 min on RULER at 1,024 tokens). Harmless in any other process (nothing there reads the
    limit); a no-op when a joblib version has no such limit."""
    try:
        from joblib.externals.loky import process_executor
    except ImportError:  # pragma: no cover - joblib without its vendored loky
        return
    if hasattr(process_executor, "_MAX_MEMORY_LEAK_SIZE"):
        process_executor._MAX_MEMORY_LEAK_SIZE = NO_LEAK_LIMIT


def worker_threads(backend: str | None, jobs: int) -> int | None:
    """Intra-op threads per local worker (the cores shared out), None for cluster workers (their own)."""
    return max(1, usable_cores() // jobs) if backend in (None, "loky") else None


def joblib_jobs(backend: str | None, jobs: int) -> int:
    """``joblib.Parallel``'s ``n_jobs`` for ``jobs`` workers on ``backend``: 1 for ``sequential``, ``jobs`` local
    processes, -1 (every worker it has) on a dask or ray cluster."""
    if backend == "sequential":
        return 1
    return jobs if backend in (None, "loky") else -1


#: most local workers ``auto_jobs`` gives (only 2 cores were measured)
AUTO_JOBS_CAP = 4
#: memory ``auto_jobs`` sets aside per worker: a ``score`` worker on the default model at 512 tokens peaked at
#: 3.2 GB resident (docs/quickstart.md), and the parent holds about 0.5 GB more
WORKER_BYTES = 4 * 2**30


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux's ``MemAvailable``; else the physical memory;
    None when neither can be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def auto_jobs(device: str, cap: int = AUTO_JOBS_CAP, worker_bytes: int = WORKER_BYTES) -> int:
    """Local worker processes for a run on ``device``: on a CPU one per usable core, at most ``cap`` and as
    many as the available memory holds at ``worker_bytes`` each (one thread per worker keeps every core
    busy while a worker runs its serial per-step work); 1 on an accelerator (one process owns it)."""
    if str(device).split(":")[0] != "cpu":
        return 1
    memory = available_memory()
    fits = cap if memory is None else memory // worker_bytes
    return max(1, min(usable_cores(), cap, fits))
