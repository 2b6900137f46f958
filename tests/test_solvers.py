"""Solvers: every method returns a valid strategy that keeps the budget constraints exactly.

Hand-computed examples pin the paper's rule and the baselines' formulas; infeasible inputs are one
clear error. The ilp == dp agreement on hundreds of random instances is in test_solvers_exact.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from signals import SignalTable, random_signal_table
from solvers import (
    SOLVERS,
    Problem,
    SolverError,
    get_solver,
    get_solver_class,
    list_methods,
    solve,
)
from solvers.base import UNOPTIMIZED_RULE, allocate, round_to_total
from solvers.pyramid import pyramid_targets
from solvers.squeeze import kmeans_1d
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


# ------------------------------------------------------------- proportional (paper)
def hand_table(entropy, cos_rows=None, dppl_rows=None, patterns=("snapkv", "tova"), budgets=(4, 8)) -> SignalTable:
    L = len(entropy)
    t = SignalTable.empty(L, ["prefill"], patterns, budgets, {"model": "hand"})
    for l in range(L):
        t.set_layer(l, "prefill", entropy=entropy[l], variance=1.0)
        for i, p in enumerate(patterns):
            for b in budgets:
                cos = cos_rows[l][i] if cos_rows else 0.9
                dppl = dppl_rows[l][i] if dppl_rows else 1.0
                t.set_cell(l, "prefill", p, b, cosine=cos, dppl=dppl)
    return t


def test_proportional_budgets_by_hand():
    # L=3, B=5, b_min=1, entropy 1:2:4 -> T = 15, 1 + 12*[1,2,4]/7 = [2.714, 4.429, 7.857]
    # floors [2, 4, 7] = 13; the 2 missing tokens go to the largest remainders (.857, .714) -> [3, 4, 8]
    t = hand_table([1.0, 2.0, 4.0])
    r = solve("proportional", Problem(table=t, global_budget=5, b_min=1))
    assert r.strategy.budgets("prefill") == [3, 4, 8]
    # L=4, B=10, b_min=2, entropy 1:1:2:4 -> 2 + 32*[1,1,2,4]/8 = [6, 6, 10, 18] (no rounding)
    t = hand_table([1.0, 1.0, 2.0, 4.0])
    r = solve("proportional", Problem(table=t, global_budget=10, b_min=2))
    assert r.strategy.budgets("prefill") == [6, 6, 10, 18]


def test_proportional_caps_at_max_budget_and_redistributes():
    # entropy 1:1:4, B=5, b_min=1 -> [3, 3, 9]; cap 6 -> layer 2 = 6, its excess 3 split 1:1 -> [4.5, 4.5, 6]
    # floors [4, 4, 6] = 14; one token to the tied remainders -> the lower layer: [5, 4, 6]
    t = hand_table([1.0, 1.0, 4.0])
    r = solve("proportional", Problem(table=t, global_budget=5, b_min=1, max_budget=6))
    assert r.strategy.budgets("prefill") == [5, 4, 6]
    # every layer capped: Σ = L·max_budget < L·B
    r = solve("proportional", Problem(table=t, global_budget=5, b_min=1, max_budget=4))
    assert r.strategy.budgets("prefill") == [4, 4, 4]


def test_proportional_patterns_by_preference():
    cos = [[0.9, 0.8], [0.7, 0.95], [0.5, 0.5]]
    dppl = [[2.0, 1.0], [0.1, 3.0], [1.0, 1.0]]
    t = hand_table([1.0, 1.0, 1.0], cos, dppl)
    by_cos = solve("proportional", Problem(table=t, global_budget=6), preference="cosine")
    assert by_cos.strategy.patterns("prefill") == ["snapkv", "tova", "snapkv"]  # tie -> first listed
    by_ppl = solve("proportional", Problem(table=t, global_budget=6), preference="ppl")
    assert by_ppl.strategy.patterns("prefill") == ["tova", "snapkv", "snapkv"]


def test_proportional_ppl_sensitivity_is_worst_case_dppl_at_the_reference_budget():
    # worst-case dPPL per layer: [2, 3, 1] -> 1 + 15*[2,3,1]/6 = [6, 8.5, 3.5] -> [6, 9, 3]? floors [6,8,3]=17,
    # one token to the largest remainder (0.5 tie between layers 1 and 2 -> layer 1): [6, 9, 3]
    dppl = [[2.0, 1.0], [0.1, 3.0], [1.0, 0.5]]
    t = hand_table([1.0, 1.0, 1.0], None, dppl)
    r = solve("proportional", Problem(table=t, global_budget=6, b_min=1), sensitivity="ppl")
    assert r.strategy.budgets("prefill") == [6, 9, 3]


def test_proportional_reads_the_grid_value_closest_to_B():
    t = SignalTable.empty(2, ["prefill"], ["snapkv", "tova"], [16, 64], {})
    for l in range(2):
        t.set_layer(l, "prefill", entropy=1.0, variance=1.0)
        t.set_cell(l, "prefill", "snapkv", 16, cosine=0.9, dppl=0.1)  # snapkv wins at 16
        t.set_cell(l, "prefill", "tova", 16, cosine=0.1, dppl=0.9)
        t.set_cell(l, "prefill", "snapkv", 64, cosine=0.1, dppl=0.9)  # tova wins at 64
        t.set_cell(l, "prefill", "tova", 64, cosine=0.9, dppl=0.1)
    assert solve("proportional", Problem(table=t, global_budget=30)).strategy.patterns("prefill") == ["snapkv"] * 2
    assert solve("proportional", Problem(table=t, global_budget=50)).strategy.patterns("prefill") == ["tova"] * 2
    assert solve("proportional", Problem(table=t, global_budget=40)).info["reference_budget"] == 16  # tie -> smaller
    r = solve("proportional", Problem(table=t, global_budget=30), reference_budget=64)
    assert r.strategy.patterns("prefill") == ["tova"] * 2


def test_proportional_skips_missing_cells_and_names_a_hopeless_layer():
    t = random_signal_table(4, phases=["prefill"], budgets=(32, 64), seed=1)
    for p in t.patterns[1:]:
        t.set_cell(2, "prefill", p, 64, cosine=float("nan"))
    r = solve("proportional", Problem(table=t, global_budget=64))
    assert r.strategy.patterns("prefill")[2] == t.patterns[0]
    t.set_cell(2, "prefill", t.patterns[0], 64, cosine=float("nan"))
    with pytest.raises(SolverError, match="layer 2 prefill has no cosine"):
        solve("proportional", Problem(table=t, global_budget=64))


# ------------------------------------------------------------------ baselines
def test_pyramid_schedule_by_hand():
    # L=4, B=100, beta=20, window=0: top = 100/20 = 5, bottom = 195, line [195, 131.67, 68.33, 5]
    # floors sum to 399; the missing token goes to layer 1 (.667): [195, 132, 68, 5]
    r = solve("pyramid", Problem(num_layers=4, global_budget=100), window=0)
    assert r.strategy.budgets("prefill") == [195, 132, 68, 5]
    np.testing.assert_allclose(pyramid_targets(4, 100, 20, 0), [195, 131.6666667, 68.3333333, 5])
    # with PyramidKV's window (8 for pyramidkv): m = 92, line 8 + [179.4 ... 4.6], mean B
    t = pyramid_targets(30, 64, 20, 8)
    assert math.isclose(t.mean(), 64) and t[0] > t[-1] and math.isclose(t[-1], 8 + 56 / 20)
    r = solve("pyramid", Problem(num_layers=30, global_budget=64, b_min=4))
    b = r.strategy.budgets("prefill")
    assert sum(b) == 30 * 64 and b == sorted(b, reverse=True) and min(b) >= 4


def test_pyramid_respects_b_min_by_lifting_the_top():
    r = solve("pyramid", Problem(num_layers=8, global_budget=40, b_min=16), window=0)
    b = r.strategy.budgets("prefill")
    assert min(b) == 16 and sum(b) == 320 and b == sorted(b, reverse=True)


def test_pyramid_refuses_a_budget_inside_the_window():
    with pytest.raises(SolverError, match="must exceed the window 8"):
        solve("pyramid", Problem(num_layers=4, global_budget=8))


def test_squeeze_by_hand():
    # three clear cosine groups; the highest (layers 4, 5) is squeezed to p*B = 50, the saved
    # 2*50 tokens go evenly to the other 4 layers: 100 + 25
    cos = [[0.5], [0.52], [0.7], [0.71], [0.95], [0.96]]
    t = hand_table([1.0] * 6, cos, None, patterns=("snapkv",), budgets=(64, 128))
    r = solve("squeeze", Problem(table=t, global_budget=100), squeeze_factor=0.5)
    assert r.strategy.budgets("prefill") == [125, 125, 125, 125, 50, 50]
    assert r.info["prefill"]["groups"] == [0, 0, 1, 1, 2, 2]
    # all layers alike: nothing to squeeze
    t = hand_table([1.0] * 4, [[0.8]] * 4, None, patterns=("snapkv",), budgets=(64, 128))
    assert solve("squeeze", Problem(table=t, global_budget=100)).strategy.budgets("prefill") == [100] * 4


def test_kmeans_1d_is_the_optimal_partition():
    rng = np.random.default_rng(0)

    def sse(x, labels):
        return sum(((x[labels == c] - x[labels == c].mean()) ** 2).sum() for c in np.unique(labels))

    for _ in range(30):
        x = rng.normal(size=int(rng.integers(3, 9)))
        labels = kmeans_1d(x, 3)
        xs = np.sort(x)
        best = min(
            sse(xs, np.array([0] * i + [1] * (j - i) + [2] * (len(x) - j)))
            for i in range(1, len(x) - 1)
            for j in range(i + 1, len(x))
        )
        assert math.isclose(sse(x, labels), best, rel_tol=1e-9, abs_tol=1e-12)
        centers = [x[labels == c].mean() for c in range(3)]
        assert centers == sorted(centers)


def test_cake_by_hand():
    # variance 1 everywhere -> preference = entropy**(1/tau1); L=4, B=10 -> T=40
    t = hand_table([1.0, 2.0, 1.0, 4.0])
    r = solve("cake", Problem(table=t, global_budget=10, b_min=1))
    assert r.strategy.budgets("prefill") == [5, 10, 5, 20]
    # tau1 = 0.5: entropy**2 = [1, 4, 1, 16] -> 40/22*[...] = [1.82, 7.27, 1.82, 29.09]
    # floors [1, 7, 1, 29] = 38; +1 to layers 0 and 2 (.818 each, before .273) -> [2, 7, 2, 29]
    r = solve("cake", Problem(table=t, global_budget=10, b_min=1), tau1=0.5)
    assert r.strategy.budgets("prefill") == [2, 7, 2, 29]
    assert "offline" in r.strategy.provenance["approximation"]
    assert "offline" in r.message


def test_ilp_and_dp_limit_distinct_budgets():
    problem = random_problem(4)
    free = solve("dp", problem)
    for k in (1, 2):
        for name in ("ilp", "dp"):
            r = solve(name, problem, max_distinct_budgets=k)
            check_constraints(r, problem)
            for phase in problem.phases:
                assert len(set(r.strategy.budgets(phase))) <= k
            assert r.objective >= free.objective - 1e-6


def test_ilp_objective_is_the_predicted_degradation_of_its_strategy():
    problem = random_problem(8)
    for objective in ("dppl", "1-cosine", "kl"):
        r = solve("ilp", problem, objective=objective)
        assert math.isclose(r.objective, r.predicted[objective], rel_tol=1e-9, abs_tol=1e-12)


def test_selection_solvers_skip_missing_cells():
    t = random_signal_table(5, seed=2, missing=0.3)
    problem = Problem(table=t, global_budget=120)
    cos = t.cosine_array()
    for name in ("ilp", "dp"):
        r = solve(name, problem)
        for phase in problem.phases:
            f = t.phase_index(phase)
            for l, c in enumerate(r.strategy.phase(phase)):
                assert not np.isnan(cos[l, f, t.pattern_index(c.pattern), t.budget_index(c.budget)])


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
