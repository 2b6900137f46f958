"""``solve --method pool-prior --prior weight|floor|cap --granularity layer|head``: the pool's weights, floors or caps
per layer or per KV head from the table's importance (the head cells of kvzip at head granularity), the level kept
only when resolved better than the plain pool on calibration samples."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_retrieval_calibration import one_thread  # noqa: F401  (autouse: one intra-op thread)
from test_search import table_path  # noqa: F401  (the tiny model and its signal table, module-scoped)

from polykv_search.patterns import make_pattern
from signals import random_signal_table
from signals.head_prefill_cells import PrefillCells
from signals.head_signals import HeadSignals
from signals.table import SignalTable
from solvers import Problem, SolverError
from solvers.pool_prior import PoolPriorSettings, PoolPriorSolver
from solvers.pool_prior_shape import head_importance, prior_values, prior_weights
from solvers.uniform import UniformSettings, UniformSolver
from tests.head_tables import random_heads

KINDS = ["prose"] * 6 + ["evidence"] * 6
POOL = make_pattern("kvzip", allocation="model")
L, H, GRID = 6, 3, (16, 32, 64)


def head_cells(layers: int, heads: int, seed: int = 3) -> tuple[PrefillCells, np.ndarray, np.ndarray]:
    """kvzip[allocation=model] head cells: answer and prose KL per (layer, KV head, budget), some below 0 (noise)."""
    rng = np.random.default_rng(seed)
    decay = 0.5 ** np.arange(len(GRID))
    answer = rng.gamma(0.8, 1.0, (layers, heads, 1)) * decay - 0.05
    prose = 0.2 * rng.gamma(0.8, 1.0, (layers, heads, 1)) * decay
    nan = np.full(answer.shape, np.nan)
    return PrefillCells("kvzip", GRID, answer, nan, prose, nan, {"allocation": "model"}), answer, prose


def head_problem(cells=True) -> tuple[Problem, np.ndarray, np.ndarray]:
    table = random_signal_table(L, budgets=GRID, patterns=("snapkv", "kvzip"), seed=3)
    made, answer, prose = head_cells(L, H)
    base = random_heads(L, H)
    table.set_heads(HeadSignals(base.retrieval, base.provenance, None, (made,) if cells else ()))
    return Problem(global_budget=32, table=table, b_min=8, phases=["prefill"]), answer, prose


def priors_of(strategy, prior: str) -> np.ndarray:
    """``[L, H]`` the strategy's per-KV-head values of ``prior`` (a layer's one value for each of its heads)."""
    default = {"weight": 1.0, "floor": 0, "cap": 0}[prior]
    out = []
    for c in strategy.prefill:
        value = c.params.get(prior, default)
        out.append(list(value) if isinstance(value, (list, tuple)) else [value] * H)
    return np.asarray(out, dtype=float)


def leaning(importance, prior: str, gain: float, noise: float, seed: int = 0):
    """Per-sample KL: 1 minus ``gain`` times how far the priors lean towards the important heads (log weight,
    floor / b or cap / b against the centred importance; 0 for the plain pool), plus per-sample noise of sd
    ``noise`` shared by every strategy and a small draw per measurement."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, noise, len(KINDS))
    centred = np.asarray(importance) - np.mean(importance)

    def lean(strategy) -> float:
        v = priors_of(strategy, prior)
        return float(np.sum((np.log(v) if prior == "weight" else v / 32) * centred))

    def evaluator(strategies):
        cols = [1.0 - gain * lean(s) for s in strategies]
        return np.stack([c + base + rng.normal(0, noise / 10, len(KINDS)) for c in cols], 1)

    return evaluator


def test_head_importance_is_the_mean_clipped_cost_of_each_heads_own_kvzip_cells_up_to_the_reference():
    p, answer, prose = head_problem()
    importance, source = head_importance(p, POOL, "sum", None)
    want = np.maximum(answer + prose, 0)[:, :, :2].mean(axis=2)  # budgets 16, 32 <= B = 32
    assert np.allclose(importance["prefill"], want) and "[16, 32]" in source and "kvzip" in source
    wide, _ = head_importance(p, POOL, "answer", 64)
    assert np.allclose(wide["prefill"], np.maximum(answer, 0).mean(axis=2))
    with pytest.raises(SolverError, match="reference_budget: 24 is not on the head cells' grid"):
        head_importance(p, POOL, "sum", 24)
    bare, _, _ = head_problem(cells=False)
    with pytest.raises(SolverError, match=r"no head cells of kvzip\[allocation=model\]; collect them with"):
        head_importance(bare, POOL, "sum", None)


def test_each_level_gives_every_cell_its_prior_and_level_zero_is_the_plain_pool():
    s = np.asarray([[0.0, 0.1], [0.4, 1.5]])
    w1 = np.asarray(prior_weights(s.reshape(-1), 1.0, 0.1)).reshape(2, 2)
    w = np.asarray(prior_weights(s.reshape(-1), 0.5, 0.1)).reshape(2, 2)
    assert (prior_values("weight", s, 0.5, 0.1, 32) == w).all()
    floors = prior_values("floor", s, 0.5, 0.1, 32)
    assert (floors == np.minimum(32, np.floor(0.5 * 32 * w1))).all() and floors.sum() <= 0.5 * 32 * 4 + 1e-9
    caps = prior_values("cap", s, 2, 0.1, 32)
    assert (caps == np.maximum(1, np.ceil(2 * 32 * w1))).all() and caps.sum() >= 32 * 4
    assert [prior_values(k, s, 0, 0.1, 32).tolist() for k in ("weight", "floor", "cap")] == [
        [[1.0, 1.0]] * 2,
        [[0, 0]] * 2,
        [[0, 0]] * 2,
    ]


@pytest.mark.parametrize("prior", ["weight", "floor", "cap"])
def test_a_level_resolved_better_gives_each_kv_head_its_own_prior(prior):
    p, _, _ = head_problem()
    importance, _ = head_importance(p, POOL, "sum", None)
    settings = PoolPriorSettings(prior=prior, granularity="head")
    solver = PoolPriorSolver(settings, evaluator=leaning(importance["prefill"], prior, 0.5, 0.05), kinds=KINDS)
    result = solver.solve(p)
    record = result.strategy.provenance["pool_prior"]
    top = min(record["means"], key=lambda n: record["means"][n]["estimate"])  # the most leaning level
    assert top != "plain-pool" and record["chosen"] == top and record["versus_solved"][top]["high"] < 0
    assert record["granularity"] == "head" and set(record[prior + "s"]) == set(record["means"])
    level = float(top.partition("=")[2])
    want = prior_values(prior, importance["prefill"], level, 0.1, 32).astype(float)
    assert (priors_of(result.strategy, prior) == want).all()
    for c in result.strategy.prefill:
        assert c.budget == 32 and make_pattern(c.pattern, **c.params).pool_identity() == POOL
    assert result.strategy.digest() == solver.trace.result.digest()


@pytest.mark.parametrize("granularity", ["layer", "head"])
@pytest.mark.parametrize("prior", ["weight", "floor", "cap"])
@pytest.mark.parametrize(("gain", "noise"), [(0.0005, 0.3), (-0.5, 0.05)], ids=["unresolved", "harmful"])
def test_the_result_is_never_resolved_worse_than_the_plain_pool_it_starts_from(granularity, prior, gain, noise):
    p, _, _ = head_problem()
    if granularity == "head":
        importance = head_importance(p, POOL, "sum", None)[0]["prefill"]
    else:
        from solvers.pool_prior_shape import layer_importance

        importance = np.repeat(np.asarray(layer_importance(p, POOL, "kl", None)[0]["prefill"])[:, None], H, 1)
    settings = PoolPriorSettings(prior=prior, granularity=granularity)
    result = PoolPriorSolver(settings, evaluator=leaning(importance, prior, gain, noise), kinds=KINDS).solve(p)
    record = result.strategy.provenance["pool_prior"]
    assert record["chosen"] == "plain-pool" and not record["replaced"]
    plain = UniformSolver(UniformSettings(pattern="kvzip[allocation=model]")).solve(p).strategy
    assert result.strategy.digest() == plain.digest()
    if gain < 0:  # every level was resolved worse than the plain pool
        assert all(record["versus_solved"][n]["low"] > 0 for n in record["means"] if n != "plain-pool")


@pytest.fixture(scope="module")
def head_table_path(table_path, tmp_path_factory):  # noqa: F811
    """The tiny model's collected table with kvzip[allocation=model] head cells beside it (2 KV heads)."""
    ckpt, path = table_path
    table = SignalTable.load(path)
    made, _, _ = head_cells(table.num_layers, 2, seed=4)
    base = random_heads(table.num_layers, 2)
    table.set_heads(HeadSignals(base.retrieval, base.provenance, None, (made,)))
    out = tmp_path_factory.mktemp("pool-prior-heads") / "table.json"
    table.save(out)
    return ckpt, out


def test_solve_pool_prior_per_head_floors_end_to_end_on_the_model(head_table_path, tmp_path, capsys):
    from polykv_search.cli import main

    ckpt, table = head_table_path
    out = tmp_path / "p.json"
    argv = ["solve", "--method", "pool-prior", "--signals", str(table), "--budget", "24", "--model", str(ckpt)]
    argv += ["--samples", "4", "--prior", "floor", "--granularity", "head", "--levels", "0.5,1", "--progress", "false"]
    assert main([*argv, "--out", str(out)]) == 0
    record = json.loads(out.read_text())["provenance"]["pool_prior"]
    assert record["prior"] == "floor" and record["granularity"] == "head"
    assert set(record["floors"]) == {"plain-pool", "floor=0.5", "floor=1"} and record["cost"]["strategy_runs"] == 12
    assert all(len(row) == 2 for row in record["floors"]["floor=1"]["prefill"])  # one floor per KV head
    printed = " ".join(capsys.readouterr().out.split())
    assert "floors per KV head" in printed and "pool-prior:" in printed
