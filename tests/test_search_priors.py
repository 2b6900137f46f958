"""Pool priors inside the whole-model search (``search --priors weight,floor``): moves that double or halve a block's
pool weight or move its floor, kept only when resolved better like every other move, never worse than the start."""

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


def space(p, start, priors=("weight", "floor")) -> SearchSpace:
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


@pytest.mark.parametrize("text", ["size", "weight,weight", "weight;floor"])
def test_bad_prior_moves_are_refused(text):
    with pytest.raises(SolverError, match="priors: none, or weight and/or floor"):
        SearchSettings(priors=text)
    assert SearchSettings(priors="weight, floor").prior_moves() == ("weight", "floor")
    assert SearchSettings().prior_moves() == ()
