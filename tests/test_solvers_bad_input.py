"""Infeasible or malformed problems and solver settings: one clear, one-line SolverError each."""

from __future__ import annotations

import numpy as np
import pytest

from signals import random_signal_table
from solvers import Problem, SolverError, solve


# ------------------------------------------------------------- bad input
def _table():
    return random_signal_table(4, budgets=(16, 32, 64), seed=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(global_budget=0.5, num_layers=4), "global budget B: must be >= 1"),
        (dict(global_budget=float("nan"), num_layers=4), "global budget B: must be a finite number"),
        (dict(global_budget=8, b_min=9, num_layers=4), r"infeasible: L\*b_min = 4\*9 = 36 exceeds L\*B"),
        (dict(global_budget=8, b_min=0, num_layers=4), "b_min: must be a positive integer"),
        (dict(global_budget=8), "num_layers: required when no signal table"),
        (dict(global_budget=8, num_layers=0), "num_layers: must be a positive integer"),
        (dict(global_budget=8, table=_table(), num_layers=5), "num_layers: 5 but the signal table has 4"),
        (dict(global_budget=8, num_layers=4, budgets=[]), "budgets: the budget grid is empty"),
        (dict(global_budget=8, table=_table(), budgets=[16, 48]), r"budgets: \[48\] not in the signal table"),
        (dict(global_budget=8, num_layers=4, phases=[]), "phases: at least one phase"),
        (dict(global_budget=8, num_layers=4, phases=["prefil"]), "phases: 'prefil' is not one of"),
        (dict(global_budget=8, table=_table(), patterns=["tova", "nope"]), "patterns: unknown pattern 'nope'"),
        (dict(global_budget=8, table=_table(), patterns=["random"]), "patterns: 'random' is not in the signal table"),
        (dict(global_budget=8, table=_table(), patterns=["full"]), "patterns: 'full' keeps every token"),
        (dict(global_budget=8, num_layers=4, max_budget=0), "max_budget: must be an integer >= b_min"),
        (dict(global_budget=8, num_layers=4, default_pattern="full"), "default_pattern"),
    ],
)
def test_bad_problems_give_one_clear_error(kwargs, message):
    with pytest.raises(SolverError, match=f"^{message}") as info:
        Problem(**kwargs)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "name, problem_kwargs, settings, message",
    [
        ("ilp", dict(num_layers=4, global_budget=64), {}, "solver 'ilp' needs a signal table"),
        ("proportional", dict(num_layers=4, global_budget=64), {}, "solver 'proportional' needs a signal table"),
        (
            "ilp",
            dict(table=_table(), global_budget=64, b_min=65 - 1, budgets=[16, 32]),
            {},
            "budgets: no grid value is >= b_min=64",
        ),
        (
            "dp",
            dict(table=_table(), global_budget=64, b_min=40, budgets=[16, 32]),
            {},
            "budgets: no grid value is >= b_min=40",
        ),
        ("dp", dict(table=_table(), global_budget=12), {}, "infeasible: the smallest usable grid value 16"),
        (
            "ilp",
            dict(table=random_signal_table(4, phases=["prefill"]), global_budget=64, phases=["decoding"]),
            {},
            "phases: 'decoding' is not in the signal table",
        ),
        (
            "proportional",
            dict(table=_table(), global_budget=64),
            {"preference": "entropy"},
            "preference: 'entropy' is not one of",
        ),
        (
            "proportional",
            dict(table=_table(), global_budget=64),
            {"reference_budget": 48},
            "reference_budget: 48 is not on the grid",
        ),
        ("ilp", dict(table=_table(), global_budget=64), {"objective": "ppl"}, "objective: 'ppl' is not one of"),
        (
            "ilp",
            dict(table=_table(), global_budget=64),
            {"max_distinct_budgets": 0},
            "max_distinct_budgets: must be >= 1",
        ),
        ("uniform", dict(num_layers=4, global_budget=64), {"pattern": "full"}, "pattern: 'full' has no budget"),
        ("uniform", dict(num_layers=4, global_budget=64), {"pattern": "lru"}, "pattern: unknown pattern 'lru'"),
        (
            "uniform",
            dict(num_layers=4, global_budget=64),
            {"colour": "red"},
            r"uniform: unknown setting\(s\) \['colour'\]",
        ),
        ("pyramid", dict(num_layers=4, global_budget=64), {"beta": 0.5}, "beta: must be >= 1"),
        ("pyramid", dict(num_layers=4, global_budget=64), {"beta": "20"}, "beta: must be a float"),
        (
            "squeeze",
            dict(table=_table(), global_budget=64),
            {"squeeze_factor": 0.0},
            r"squeeze_factor: must be in \(0, 1\]",
        ),
        ("cake", dict(table=_table(), global_budget=64), {"tau1": 0}, "tau1/tau2: must be > 0"),
        (
            "dp",
            dict(table=random_signal_table(4, budgets=tuple(range(8, 28)), seed=0), global_budget=20),
            {"max_distinct_budgets": 10, "max_subsets": 100},
            r"dp: C\(20, 10\) = 184756 budget subsets exceeds",
        ),
    ],
)
def test_bad_solver_input_gives_one_clear_error(name, problem_kwargs, settings, message):
    with pytest.raises(SolverError, match=f"^{message}") as info:
        solve(name, Problem(**problem_kwargs), **settings)
    assert "\n" not in str(info.value)


def test_missing_entropy_is_named():
    t = _table()
    t._entropy[2, 0] = np.nan  # a partially collected table
    with pytest.raises(SolverError, match=r"entropy missing for prefill layers \[2\]"):
        solve("proportional", Problem(table=t, global_budget=64))
    with pytest.raises(SolverError, match=r"entropy/variance missing for prefill layers \[2\]"):
        solve("cake", Problem(table=t, global_budget=64))
