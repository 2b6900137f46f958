"""ilp and dp solve the same cell-selection problem exactly: they reach the same objective.

Random instances vary everything that matters: layers, patterns, grid (arbitrary integers, so the
dp's gcd compression is exercised), B, b_min, missing cells, both objectives, and the at-most-k
distinct budgets side constraint, with and without the ilp's presolve. Tiny instances are also
checked against brute force.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from signals import random_signal_table
from solvers import Problem, SolverError, solve
from solvers.base import cost_tensor
from solvers.dp import solve_phase_dp
from solvers.ilp import solve_phase_ilp
from strategies import PHASES

PATTERNS = ("snapkv", "tova", "h2o", "knorm", "streaming_llm", "random")
N_INSTANCES = 220


def random_instance(seed: int):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 8))
    P = int(rng.integers(1, 5))
    G = int(rng.integers(1, 6))
    if rng.random() < 0.5:
        budgets = sorted(rng.choice(np.arange(1, 80), size=G, replace=False).tolist())
    else:  # a power-of-two-like grid with a common step
        budgets = [int(16 * 2**i) for i in range(G)]
    table = random_signal_table(
        L,
        phases=("prefill",),
        patterns=PATTERNS[:P],
        budgets=budgets,
        seed=seed,
        missing=float(rng.choice([0.0, 0.0, 0.2])),
    )
    b_min = int(rng.integers(1, budgets[0] + 1))
    B = float(rng.uniform(budgets[0], budgets[-1] + 5))
    k = None if rng.random() < 0.6 else int(rng.integers(1, G + 1))
    objective = "dppl" if rng.random() < 0.5 else "1-cosine"
    return Problem(table=table, global_budget=B, b_min=b_min), k, objective


def _solve_or_error(name, problem, **settings):
    try:
        return solve(name, problem, **settings)
    except SolverError as err:
        return err


def test_dp_and_ilp_reach_the_same_objective_on_random_instances():
    solved = 0
    for seed in range(N_INSTANCES):
        problem, k, objective = random_instance(seed)
        settings = {"objective": objective, "max_distinct_budgets": k}
        # every 4th instance: the MILP over every available cell, without the exact presolve
        a = _solve_or_error("ilp", problem, reduce=seed % 4 != 0, **settings)
        b = _solve_or_error("dp", problem, **settings)
        if isinstance(a, SolverError) or isinstance(b, SolverError):
            # both must refuse (no feasible assignment, e.g. a layer with every cell missing)
            assert isinstance(a, SolverError) and isinstance(b, SolverError), (seed, a, b)
            continue
        assert a.success
        assert math.isclose(a.objective, b.objective, rel_tol=1e-9, abs_tol=1e-6), (seed, a.objective, b.objective)
        for r in (a, b):
            budgets = r.strategy.budgets("prefill")
            assert sum(budgets) <= problem.total and min(budgets) >= problem.b_min
            assert set(budgets) <= set(problem.budgets)
            if k is not None:
                assert len(set(budgets)) <= k
        solved += 1
    assert solved >= 200


def brute_force(cost: np.ndarray, grid, total: int, k=None) -> float:
    L, P, G = cost.shape
    best = math.inf
    for cells in itertools.product(range(P * G), repeat=L):
        gs = [c % G for c in cells]
        if sum(grid[g] for g in gs) > total or (k is not None and len(set(gs)) > k):
            continue
        best = min(best, sum(cost[l, c // G, c % G] for l, c in enumerate(cells)))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_both_match_brute_force_on_tiny_instances(seed):
    rng = np.random.default_rng(1000 + seed)
    L, P, G = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 4))
    grid = tuple(sorted(rng.choice(np.arange(1, 20), size=G, replace=False).tolist()))
    cost = rng.uniform(0, 1, size=(L, P, G))
    cost[rng.random(cost.shape) < 0.15] = np.inf
    total = int(rng.integers(L * grid[0], L * grid[-1] + 1))
    k = None if seed % 2 else int(rng.integers(1, G + 1))
    names = list(PATTERNS[:P])
    expected = brute_force(cost, grid, total, k)
    if not math.isfinite(expected):
        with pytest.raises(SolverError):
            solve_phase_dp(cost, names, grid, total, k)
        with pytest.raises(SolverError):
            solve_phase_ilp(cost, names, grid, total, k, 10.0)
        return
    dp = solve_phase_dp(cost, names, grid, total, k)
    assert math.isclose(dp.objective, expected, abs_tol=1e-9)
    for reduce in (True, False):
        ilp = solve_phase_ilp(cost, names, grid, total, k, 10.0, reduce)
        assert math.isclose(ilp.objective, expected, abs_tol=1e-6)


def test_two_phases_add_up():
    t = random_signal_table(6, seed=5)
    problem = Problem(table=t, global_budget=90, b_min=8)
    a, b = solve("ilp", problem), solve("dp", problem)
    assert math.isclose(a.objective, b.objective, rel_tol=1e-9)
    assert math.isclose(a.objective, a.info["prefill"]["objective"] + a.info["decoding"]["objective"])
    per_phase = [solve("dp", Problem(table=t, global_budget=90, b_min=8, phases=[phase])).objective for phase in PHASES]
    assert math.isclose(sum(per_phase), b.objective)


def test_ilp_presolve_keeps_an_optimal_cell_in_every_layer():
    from solvers.ilp import reduce_cells

    for seed in range(20):
        t = random_signal_table(
            12, phases=("prefill",), patterns=PATTERNS[:4], budgets=(8, 16, 24, 40, 64, 100), seed=seed
        )
        cost = cost_tensor(t, "prefill", "dppl", range(4), range(6))
        total = 12 * int(np.random.default_rng(seed).integers(9, 90))
        keep, _ = reduce_cells(cost, t.budgets, total, None)
        reduced = np.where(keep, cost, np.inf)
        full = solve_phase_dp(cost, list(PATTERNS[:4]), t.budgets, total)
        assert keep.sum() < np.isfinite(cost).sum()
        assert math.isclose(
            solve_phase_dp(reduced, list(PATTERNS[:4]), t.budgets, total).objective, full.objective, abs_tol=1e-12
        )


def test_dp_picks_the_best_pattern_per_budget():
    t = random_signal_table(5, seed=9, patterns=("snapkv", "tova", "h2o"))
    problem = Problem(table=t, global_budget=100)
    r = solve("dp", problem, objective="dppl")
    for phase in problem.phases:
        cost = cost_tensor(t, phase, "dppl", range(3), range(len(t.budgets)))
        for l, c in enumerate(r.strategy.phase(phase)):
            g = t.budget_index(c.budget)
            assert cost[l, t.pattern_index(c.pattern), g] == cost[l, :, g].min()
