"""Shared test set-up.

``strategies`` is the bottom layer: it learns the eviction patterns from the catalog that the core
registers when ``polykv_search`` is imported (see :mod:`strategies.catalog`). Import it here so that
a test module using only ``strategies`` works when run on its own.
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

import polykv_search  # noqa: F401  (registers the pattern catalog)


def pytest_configure(config):
    """An xdist worker takes its share of the cores for torch's intra-op threads (two workers with two
    threads each on two cores would oversubscribe them)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        from polykv_search.parallel import usable_cores

        torch.set_num_threads(max(1, usable_cores() // workers))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Every test leaves torch's intra-op thread count as it found it: a test that sets it (to make a
    comparison deterministic) must not change the timing or the thread checks of the next test in its
    xdist worker."""
    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` as a module (a script, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reproduce():
    """``benchmarks/reproduce.py``."""
    return benchmark_script("reproduce")


@pytest.fixture(scope="module")
def diagnose():
    """``benchmarks/diagnose_additivity.py``."""
    return benchmark_script("diagnose_additivity")


@pytest.fixture(scope="module")
def gpu_check():
    """``benchmarks/gpu_check.py``."""
    return benchmark_script("gpu_check")


@pytest.fixture(scope="module")
def v1():
    """The compare tests' hand-made results file, version 1 (``tests/compare_support.py``), compared."""
    from polykv_search import compare
    from tests.compare_support import V1

    return compare.compare([compare.load_results(V1)], sources=[str(V1)])


@pytest.fixture(scope="module")
def v2():
    """The same, version 2 (per-sample KL, ``provenance.engine``)."""
    from polykv_search import compare
    from tests.compare_support import V2

    return compare.compare([compare.load_results(V2)], sources=[str(V2)])
