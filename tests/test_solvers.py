"""Solvers: every method returns a valid strategy that keeps the budget constraints exactly, ablations included."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from signals import random_signal_table
from solvers import Problem, SolverError, get_solver, solve
from solvers.base import UNOPTIMIZED_RULE
from strategies import PHASES, Strategy

BUILTIN = ["proportional", "ilp", "dp", "uniform", "pyramid", "squeeze", "cake"]
ON_GRID = {"ilp", "dp"}  # budgets drawn from the grid
EXACT_SUM = {"proportional", "uniform", "pyramid", "squeeze", "cake"}  # Σ = floor(L·B) (uniform: L·floor(B))


def random_problem(seed: int, **overrides) -> Problem:
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 13))
    budgets = sorted(rng.choice(np.arange(8, 300), size=int(rng.integers(3, 7)), replace=False).tolist())
    table = random_signal_table(
        L, budgets=budgets, seed=seed, patterns=("snapkv", "tova", "h2o", "knorm", "streaming_llm")
    )
    b_min = int(rng.integers(1, budgets[0] + 1))
    B = float(rng.uniform(budgets[0] + 1, budgets[-1]))
    kwargs = dict(table=table, global_budget=round(B, 2), b_min=b_min, seed=seed)
    kwargs.update(overrides)
    return Problem(**kwargs)


def check_constraints(result, problem: Problem) -> None:
    s = result.strategy
    assert isinstance(s, Strategy)
    assert s.num_layers == problem.num_layers
    for phase in PHASES:
        budgets = s.budgets(phase)
        assert all(isinstance(b, int) and b >= problem.b_min for b in budgets)
        assert sum(budgets) <= problem.total
        if problem.max_budget is not None:
            assert max(budgets) <= problem.max_budget
        if phase not in problem.phases:
            assert s.phase(phase) == [s.phase(phase)[0]] * problem.num_layers
            assert s.patterns(phase)[0] == problem.default_pattern and budgets[0] == problem.uniform_budget
            continue
        if result.solver in ON_GRID:
            assert set(budgets) <= set(problem.budgets)
        if result.solver in ("ilp", "dp", "proportional"):
            assert set(s.patterns(phase)) <= set(problem.patterns)
        if result.solver == "uniform":
            assert budgets == [problem.uniform_budget] * problem.num_layers
        elif result.solver in EXACT_SUM and problem.max_budget is None:
            assert sum(budgets) == problem.total


# ---------------------------------------------------------------- every solver
@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("seed", range(6))
def test_every_solver_keeps_the_constraints_on_random_tables(name, seed):
    problem = random_problem(seed)
    result = solve(name, problem)
    check_constraints(result, problem)
    assert result.success
    assert result.timing["solve_s"] >= 0
    prov = result.strategy.provenance
    assert prov["solver"] == name
    assert prov["settings"] == result.settings == get_solver(name).settings.to_json()
    assert prov["global_budget"] == problem.global_budget and prov["b_min"] == problem.b_min
    assert prov["signals_digest"] == problem.table.digest()
    assert prov["unoptimized_phases"] == UNOPTIMIZED_RULE
    json.dumps(result.to_json())  # the whole result is JSON


@pytest.mark.parametrize("name", BUILTIN)
def test_every_solver_is_deterministic_and_round_trips_through_strategy_json(name, tmp_path):
    p1, p2 = random_problem(11), random_problem(11)
    r1, r2 = solve(name, p1), solve(name, p2)
    assert r1.strategy.to_json() == r2.strategy.to_json()
    path = r1.strategy.save(tmp_path / "strategy.json")
    loaded = Strategy.load(path)
    assert loaded.to_json() == r1.strategy.to_json()
    assert loaded.digest() == r1.strategy.digest()


@pytest.mark.parametrize("name", BUILTIN)
def test_max_budget_caps_every_layer(name):
    problem = random_problem(5)
    cap = int(problem.global_budget * 1.3)
    capped = Problem(table=problem.table, global_budget=problem.global_budget, b_min=problem.b_min, max_budget=cap)
    check_constraints(solve(name, capped), capped)


@pytest.mark.parametrize("name", BUILTIN)
def test_phases_not_optimized_get_the_uniform_default(name):
    base = random_problem(3)
    problem = Problem(table=base.table, global_budget=base.global_budget, b_min=base.b_min, phases=["prefill"])
    result = solve(name, problem)
    check_constraints(result, problem)
    dec = result.strategy.phase("decoding")
    assert {c.pattern for c in dec} == {"snapkv"}
    assert {c.budget for c in dec} == {math.floor(problem.global_budget)}
    assert result.strategy.provenance["phases_optimized"] == ["prefill"]
    assert [c.optimized for c in result.choices if c.phase == "decoding"] == [False] * problem.num_layers


# ---------------------------------------------------------------- ablations (patterns only / budgets only)
@pytest.mark.parametrize("name", BUILTIN)
def test_uniform_budgets_keeps_floor_B_in_every_optimized_layer(name):
    base = random_problem(4)
    problem = Problem(table=base.table, global_budget=base.global_budget, b_min=base.b_min, uniform_budgets=True)
    result = solve(name, problem)
    for phase in problem.phases:
        assert result.strategy.budgets(phase) == [problem.uniform_budget] * problem.num_layers
    assert result.strategy.provenance["ablation"] == {"uniform_budgets": True, "fixed_pattern": None}


@pytest.mark.parametrize("name", BUILTIN)
def test_fixed_pattern_is_used_by_every_optimized_layer(name):
    base = random_problem(4)
    problem = Problem(table=base.table, global_budget=base.global_budget, b_min=base.b_min, fixed_pattern="tova")
    result = solve(name, problem)
    check_constraints(result, problem)
    for phase in problem.phases:
        assert set(result.strategy.patterns(phase)) == {"tova"}
    assert problem.patterns == ("tova",)
    assert result.strategy.provenance["ablation"]["fixed_pattern"] == "tova"


def test_uniform_budgets_with_ilp_picks_the_best_pattern_at_B_per_layer():
    t = random_signal_table(6, budgets=(32, 64, 128), seed=2, patterns=("snapkv", "tova", "h2o"))
    problem = Problem(table=t, global_budget=64, b_min=16, uniform_budgets=True, phases=["prefill"])
    result = solve("ilp", problem, objective="dppl")
    j = t.budget_index(64)
    for layer, choice in enumerate(result.strategy.phase("prefill")):
        row = [
            t.dppl_array()[layer, t.phase_index("prefill"), t.pattern_index(p), j] for p in ("snapkv", "tova", "h2o")
        ]
        assert choice.pattern == ("snapkv", "tova", "h2o")[int(np.argmin(row))]
        assert choice.budget == 64


def test_fixed_pattern_must_be_allowed_and_in_the_table():
    t = random_signal_table(3, patterns=("snapkv", "tova"), seed=0)
    with pytest.raises(SolverError, match="fixed_pattern: 'h2o' is not in the signal table"):
        Problem(table=t, global_budget=64, fixed_pattern="h2o")
    with pytest.raises(SolverError, match="not among the allowed patterns"):
        Problem(table=t, global_budget=64, fixed_pattern="tova", patterns=["snapkv"])
    with pytest.raises(SolverError, match="not a budgeted pattern"):
        Problem(table=t, global_budget=64, fixed_pattern="full")


def test_default_phases_follow_the_table():
    t = random_signal_table(4, phases=["decoding"], seed=0)
    problem = Problem(table=t, global_budget=100)
    assert problem.phases == ("decoding",)
    r = solve("ilp", problem)
    assert set(r.strategy.budgets("decoding")) <= set(t.budgets)
    assert r.strategy.budgets("prefill") == [100] * 4


def test_table_free_solvers_need_no_table():
    p = Problem(num_layers=6, global_budget=64.5, b_min=4)
    u = solve("uniform", p, pattern="tova")
    assert u.strategy.budgets("prefill") == u.strategy.budgets("decoding") == [64] * 6
    assert u.strategy.patterns("decoding") == ["tova"] * 6
    assert u.predicted == {"dppl": None, "1-cosine": None, "kl": None}
    py = solve("pyramid", p)
    assert sum(py.strategy.budgets("prefill")) == math.floor(6 * 64.5)
    assert py.strategy.patterns("prefill") == ["pyramidkv"] * 6
    assert py.strategy.provenance["signals_digest"] is None
