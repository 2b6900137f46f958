"""Pool priors inside the whole-model search (``search --priors weight,floor,cap``): moves that double or halve a
block's pool weight, move its floor or tighten / loosen its cap, kept only when resolved better like every other move,
never worse than the start."""

from __future__ import annotations

import numpy as np
import pytest
from test_search import KINDS, PATTERNS, problem, uniform

from polykv_search.patterns import make_pattern
from polykv_search.stats import paired_difference_interval
from solvers import SolverError
from solvers.guard import strata, uniform_candidates
from solvers.search_loop import local_search
from solvers.search_space import Move, SearchSpace, check_budgets
from solvers.whole_model import SearchSettings
from strategies import LayerChoice, Strategy

POOLED = PATTERNS[2]  # kvzip[allocation=model]


def space(p, start, priors=("weight", "floor", "cap")) -> SearchSpace:
    return SearchSpace(p, start, blocks=3, step=8, patterns=p.patterns, priors=priors)


def prior_of(strategy, key: str, default):
    return [c.params.get(key, default) for c in strategy.prefill]


def test_prior_moves_change_only_the_blocks_pool_weight_or_floor_and_keep_budgets_and_the_pool():
    p = problem()
    start = uniform(p, POOLED)
    s = space(p, start)
    kinds = {m.kind for m in s.moves(start)}
    assert {"weight", "floor"} <= kinds and "weight" not in {m.kind for m in space(p, start, ()).moves(start)}
    doubled = s.apply(start, Move("weight", "prefill", 1, amount=2.0))
    assert prior_of(doubled, "weight", 1.0) == [1.0, 1.0, 2.0, 2.0, 1.0, 1.0]  # block 1: layers 2-3
    floored = s.apply(doubled, Move("floor", "prefill", 0, amount=8))
    assert prior_of(floored, "floor", 0) == [8, 8, 0, 0, 0, 0] and prior_of(floored, "weight", 1.0)[2] == 2.0
    for strategy in (doubled, floored):
        assert strategy.budgets("prefill") == start.budgets("prefill")
        check_budgets(strategy, p)
        pools = {make_pattern(c.pattern, **c.params).pool_identity() for c in strategy.prefill}
        assert pools == {make_pattern("kvzip", allocation="model")}
    assert s.apply(start, Move("floor", "prefill", 0, amount=-8)) is None  # a floor of 0 cannot go lower
    halved = s.apply(doubled, Move("weight", "prefill", 1, amount=0.5))
    assert halved.digest() == start.digest()  # back to the plain pool, written as it


def test_prior_moves_act_on_per_head_values_and_leave_other_patterns_alone():
    p = problem()
    tuple_weights = LayerChoice("kvzip", 32, {"allocation": "model", "weight": (1.0, 2.0, 4.0), "cap": (0, 20, 0)})
    prefill = [tuple_weights] * 2 + [LayerChoice("snapkv", 32)] * 4
    start = Strategy(prefill, [LayerChoice("snapkv", 32)] * 6, 32.0, 8, {})
    s = space(p, start)
    doubled = s.apply(start, Move("weight", "prefill", 0, amount=2.0))
    assert [list(w) for w in prior_of(doubled, "weight", 1.0)[:2]] == [[2.0, 4.0, 8.0]] * 2
    floored = s.apply(start, Move("floor", "prefill", 0, amount=24))
    assert [list(f) for f in prior_of(floored, "floor", 0)[:2]] == [[24, 20, 24]] * 2  # within each head's cap
    assert s.apply(start, Move("weight", "prefill", 1, amount=2.0)) is None  # snapkv layers only: no pool


def test_cap_moves_walk_the_ladder_none_budget_then_step_down_and_back():
    """A block's cap tightens from none to its budget b (32), then by ``step`` (8) tokens, never below the floor or 1;
    loosening retraces the ladder and lifts a cap of b or more. Budgets, the pool and other blocks stay."""
    p = problem()
    start = uniform(p, POOLED)
    s = space(p, start)
    assert {m.amount for m in s.moves(start) if m.kind == "cap"} == {-8, 8}
    assert "cap" not in {m.kind for m in space(p, start, ("weight", "floor")).moves(start)}
    tighter, looser = Move("cap", "prefill", 2, amount=-8), Move("cap", "prefill", 2, amount=8)
    assert s.apply(start, looser) is None  # no cap to loosen
    ladder = [start]
    for _ in range(5):
        ladder.append(s.apply(ladder[-1], tighter))
    assert [prior_of(x, "cap", 0)[4:] for x in ladder] == [[0, 0], [32, 32], [24, 24], [16, 16], [8, 8], [1, 1]]
    assert s.apply(ladder[-1], tighter) is None  # at least 1 token
    for strategy in ladder[1:]:
        assert prior_of(strategy, "cap", 0)[:4] == [0] * 4 and strategy.budgets("prefill") == start.budgets("prefill")
        pools = {make_pattern(c.pattern, **c.params).pool_identity() for c in strategy.prefill}
        assert pools == {make_pattern("kvzip", allocation="model")}
        check_budgets(strategy, p)
    back = ladder[-2]  # cap 8 (the clamp at 1 leaves the ladder: 1 loosens to 9)
    assert prior_of(s.apply(ladder[-1], looser), "cap", 0)[4:] == [9, 9]
    for expected in ([16, 16], [24, 24], [32, 32], [0, 0]):
        back = s.apply(back, looser)
        assert prior_of(back, "cap", 0)[4:] == expected
    assert back.digest() == start.digest()  # lifted: the plain pool, written as it
    assert "layers 4-5 pool cap -8" in tighter.label(s.blocks)


def test_cap_moves_keep_each_heads_floor_and_act_per_head():
    p = problem()
    per_head = LayerChoice("kvzip", 32, {"allocation": "model", "floor": (20, 0, 4), "cap": (0, 40, 12)})
    start = Strategy([per_head] * 2 + [LayerChoice("snapkv", 32)] * 4, [LayerChoice("snapkv", 32)] * 6, 32.0, 8, {})
    s = space(p, start)
    tighter = s.apply(start, Move("cap", "prefill", 0, amount=-8))
    assert [list(c) for c in prior_of(tighter, "cap", 0)[:2]] == [[32, 32, 4]] * 2  # none -> b; 40 -> 32; floor 4
    assert [list(f) for f in prior_of(tighter, "floor", 0)[:2]] == [[20, 0, 4]] * 2
    again = s.apply(tighter, Move("cap", "prefill", 0, amount=-8))
    assert [list(c) for c in prior_of(again, "cap", 0)[:2]] == [[24, 24, 4]] * 2
    floor_bound = s.apply(again, Move("cap", "prefill", 0, amount=-8))
    assert [list(c) for c in prior_of(floor_bound, "cap", 0)[:2]] == [[20, 16, 4]] * 2  # never below the floor
    looser = s.apply(start, Move("cap", "prefill", 0, amount=8))
    assert [list(c) for c in prior_of(looser, "cap", 0)[:2]] == [[0, 0, 20]] * 2  # 40 >= b lifted; 12 -> 20
    assert s.apply(start, Move("cap", "prefill", 1, amount=-8)) is None  # snapkv layers only: no pool


def test_a_cap_move_resolved_better_is_accepted_on_the_whole_model_objective():
    """KL falls when layers 4-5 (block 2) are capped tighter; every other change is neutral: the search keeps the
    two cap moves it is allowed (resolved better each), and nothing else."""
    p = problem()
    start = uniform(p, POOLED)
    rng = np.random.default_rng(1)
    base = rng.normal(0, 0.05, len(KINDS))

    def objective(strategies):
        caps = [prior_of(s, "cap", 0)[4] for s in strategies]
        gain = [0.0 if c == 0 else (48 - c) / 16 for c in caps]  # cap 32: 1, cap 24: 1.5
        return np.stack([1.0 - 0.3 * g + base + rng.normal(0, 0.005, len(KINDS)) for g in gain], 1)

    def searched(priors):
        return local_search(
            [("start", start)],
            lambda x: space(p, x, priors),
            objective,
            KINDS,
            neighbors=60,
            max_moves=2,
            max_evaluations=150,
        )

    trace = searched(("cap",))
    assert [step.move.kind for step in trace.steps] == ["cap", "cap"]
    assert all(step.versus.high < 0 for step in trace.steps) and trace.final.high < 0
    assert prior_of(trace.result, "cap", 0) == [0, 0, 0, 0, 24, 24]
    assert searched(("weight", "floor")).steps == []  # without cap moves, nothing is resolved better


def test_a_prior_move_resolved_better_is_accepted_and_the_result_keeps_it():
    """KL falls with the weight of layers 0-1 (block 0); every other change is neutral."""
    p = problem()
    start = uniform(p, POOLED)
    rng = np.random.default_rng(0)
    base = rng.normal(0, 0.05, len(KINDS))

    def objective(strategies):
        gain = [float(np.log(np.mean(prior_of(s, "weight", 1.0)[:2]))) for s in strategies]
        return np.stack([1.0 - 0.3 * g + base + rng.normal(0, 0.005, len(KINDS)) for g in gain], 1)

    trace = local_search(
        [("start", start)], lambda s: space(p, s), objective, KINDS, neighbors=40, max_moves=2, max_evaluations=90
    )
    assert [step.move.kind for step in trace.steps] == ["weight", "weight"]
    assert prior_of(trace.result, "weight", 1.0)[:2] == [4.0, 4.0] and trace.final.high < 0


@pytest.mark.parametrize("seed", range(4))
def test_with_prior_moves_the_result_is_never_resolved_worse_than_its_start(seed):
    rng = np.random.default_rng(seed)
    table = {}

    def objective(strategies):
        return np.stack([table.setdefault(s.digest(), rng.gamma(2.0, 0.5, len(KINDS))) for s in strategies], 1)

    p = problem()
    start = uniform(p, POOLED)
    starts = [("start", start), *uniform_candidates(p, start)]
    trace = local_search(starts, lambda s: space(p, s), objective, KINDS, max_evaluations=30, seed=seed)
    first = table[dict(starts)[trace.start].digest()]
    iv = paired_difference_interval(strata(table[trace.result.digest()], KINDS), strata(first, KINDS))
    assert not iv.low > 0


@pytest.mark.parametrize("text", ["size", "weight,weight", "weight;floor", "cap,cap"])
def test_bad_prior_moves_are_refused(text):
    with pytest.raises(SolverError, match="priors: none, or any of weight, floor, cap"):
        SearchSettings(priors=text)
    assert SearchSettings(priors="weight, floor").prior_moves() == ("weight", "floor")
    assert SearchSettings(priors="cap,weight").prior_moves() == ("cap", "weight")
    assert SearchSettings().prior_moves() == ()
