"""The paper's proportional rule and the baselines' formulas, pinned on hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_solvers import check_constraints, random_problem

from signals import SignalTable, random_signal_table
from solvers import Problem, SolverError, solve
from solvers.pyramid import pyramid_targets
from solvers.squeeze import kmeans_1d


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
