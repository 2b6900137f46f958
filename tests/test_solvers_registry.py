"""The solver registry, settings that describe themselves for a CLI, and the budget allocation helpers."""

from __future__ import annotations

import numpy as np
import pytest
from test_solvers import BUILTIN

from solvers import SOLVERS, SolverError, get_solver, get_solver_class, list_methods
from solvers.base import allocate, round_to_total


# ------------------------------------------------------------- registry & helpers
def test_registry_lists_every_method_with_a_description():
    methods = {m.name: m for m in list_methods()}
    assert set(BUILTIN) | {"optuna"} <= set(methods)
    for name in BUILTIN:
        m = methods[name]
        assert m.available and m.description and "\n" not in m.description
        assert SOLVERS[name].name == name and name in SOLVERS
    assert methods["uniform"].needs_table is False and methods["ilp"].needs_table is True
    assert methods["optuna"].available  # its own tests: tests/test_solver_optuna.py
    with pytest.raises(SolverError, match="unknown solver 'nope'; known: proportional, ilp, dp"):
        get_solver("nope")
    with pytest.raises(KeyError):
        SOLVERS["nope"]


def test_settings_describe_themselves_for_a_cli():
    info = {i.name: i for i in get_solver_class("proportional").Settings.fields_info()}
    assert info["preference"].choices == ("cosine", "ppl", "kl") and info["preference"].flag == "--preference"
    assert info["reference_budget"].type == "int|None" and info["reference_budget"].default is None
    assert all(i.help for i in info.values())
    settings = get_solver_class("pyramid").Settings.from_strings({"--beta": "10", "window": "none"})
    assert settings.beta == 10.0 and settings.window is None
    s = get_solver_class("ilp").Settings.from_strings({"max-distinct-budgets": "2", "objective": "1-cosine"})
    assert s.max_distinct_budgets == 2 and s.objective == "1-cosine"
    with pytest.raises(SolverError, match="beta: 'steep' is not a valid float"):
        get_solver_class("pyramid").Settings.from_strings({"beta": "steep"})
    with pytest.raises(SolverError, match="--gamma: unknown setting"):
        get_solver_class("pyramid").Settings.from_strings({"--gamma": "1"})
    solver = get_solver_class("pyramid")(settings)
    assert solver.settings is settings
    assert get_solver("pyramid", beta=20).settings.beta == 20.0  # ints accepted for floats


def test_allocate_keeps_the_sum_and_the_bounds():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 20))
        lo = int(rng.integers(1, 10))
        total = int(rng.integers(n * lo, n * lo + 500))
        hi = None if rng.random() < 0.5 else int(rng.integers(lo, lo + 100))
        w = rng.gamma(1.0, 1.0, size=n) * (rng.random(n) < 0.8)
        out = allocate(total, weights=w, base=lo, lo=lo, hi=hi)
        assert out.min() >= lo and (hi is None or out.max() <= hi)
        assert out.sum() == (total if hi is None else min(total, n * hi))
    with pytest.raises(SolverError, match="infeasible"):
        allocate(5, weights=[1, 1, 1], lo=2)
    assert round_to_total(np.array([1.5, 1.5, 1.0]), 4, 1).tolist() == [2, 1, 1]  # ties -> lower index
