"""Shared test set-up.

``strategies`` is the bottom layer: it learns the eviction patterns from the catalog that the core
registers when ``polykv_search`` is imported (see :mod:`strategies.catalog`). Import it here so that
a test module using only ``strategies`` works when run on its own.
"""

import importlib.util
from pathlib import Path

import pytest

import polykv_search  # noqa: F401  (registers the pattern catalog)


@pytest.fixture(scope="module")
def reproduce():
    """``benchmarks/reproduce.py`` as a module (it is a script, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reproduce.py"
    spec = importlib.util.spec_from_file_location("reproduce", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
