"""What the type check covers: CI runs ``mypy`` with the paths configured in ``pyproject.toml``
(``follow_imports = "silent"`` reports nothing outside them, so a package left out is not checked at all)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_mypy_checks_the_pattern_boundary_the_runtime_strategies_signals_and_solvers():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    checked = {"polykv_search/patterns", "polykv_search/runtime", "polykv_search/scoring", "strategies"}
    assert checked | {"signals", "solvers"} <= set(config["files"])
    assert all((ROOT / path).is_dir() for path in config["files"])


def test_ci_runs_mypy_on_the_configured_paths():
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert "mypy" in commands  # bare: the paths are pyproject.toml's, never a narrower list given here
