"""Shared test set-up.

``strategies`` is the bottom layer: it learns the eviction patterns from the catalog that the core
registers when ``polykv_search`` is imported (see :mod:`strategies.catalog`). Import it here so that
a test module using only ``strategies`` works when run on its own.
"""

import importlib.util
from pathlib import Path

import pytest

import polykv_search  # noqa: F401  (registers the pattern catalog)


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
