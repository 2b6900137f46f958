"""``solve --method pool-prior``: per-layer weights on KVzip's model-wide pool from the table's importance, the
exponent kept only when resolved better than the plain pool on calibration samples; resumable."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_retrieval_calibration import one_thread  # noqa: F401  (autouse: one intra-op thread)
from test_search import table_path  # noqa: F401  (the tiny model and its signal table, module-scoped)

from polykv_search.patterns import make_pattern
from signals import random_signal_table
from signals.predict import cell_costs
from solvers import Problem, SolverError, get_solver_class
from solvers.pool_prior import PoolPriorSolver, layer_importance, prior_weights
from solvers.uniform import UniformSettings, UniformSolver

KINDS = ["prose"] * 6 + ["evidence"] * 6
POOL = make_pattern("kvzip", allocation="model")


def problem(patterns=("snapkv", "kvzip"), **kw) -> Problem:
    table = random_signal_table(6, budgets=(16, 32, 64), patterns=patterns, seed=3)
    return Problem(global_budget=32, table=table, b_min=8, phases=["prefill"], **kw)


def weights_of(strategy, phase="prefill") -> list[float]:
    return [float(c.params.get("weight", 1.0)) for c in strategy.phase(phase)]


def aligned(importance, gain: float, noise: float, seed: int = 0):
    """Per-sample KL: 1 minus ``gain`` times how far the weights lean towards the important layers, plus per-sample
    noise of sd ``noise`` shared by every strategy (differences are the gain) and a small draw per measurement."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, noise, len(KINDS))
    centred = np.asarray(importance) - np.mean(importance)

    def evaluator(strategies):
        cols = [1.0 - gain * float(np.dot(np.log(weights_of(s)), centred)) for s in strategies]
        return np.stack([c + base + rng.normal(0, noise / 10, len(KINDS)) for c in cols], 1)

    return evaluator


def test_importance_is_the_mean_clipped_cost_of_the_pools_own_cells_up_to_the_reference_budget():
    p = problem()
    importance, source = layer_importance(p, POOL, "kl", None)
    costs = cell_costs(p.table, "kl", "clip")[:, 0, p.table.patterns.index("kvzip")]  # (L, G); prefill
    assert importance["prefill"] == pytest.approx(costs[:, :2].mean(axis=1).tolist())  # budgets 16, 32 <= B
    assert "kvzip" in source and "[16, 32]" in source
    wide, _ = layer_importance(p, POOL, "kl", 64)
    assert wide["prefill"] == pytest.approx(costs.mean(axis=1).tolist())
    other = problem(patterns=("snapkv", "tova"))  # no kvzip cells: the worst pattern's cost
    worst, source = layer_importance(other, POOL, "kl", None)
    both = cell_costs(other.table, "kl", "clip")[:, 0, :, :2].mean(axis=2).max(axis=1)
    assert worst["prefill"] == pytest.approx(both.tolist()) and "worst pattern" in source


def test_the_weights_are_one_at_alpha_zero_and_lean_towards_the_important_layers():
    importance = [0.0, 0.1, 0.4, 1.5]
    assert prior_weights(importance, 0.0, 0.1) == [1.0] * 4
    w = prior_weights(importance, 1.0, 0.1)
    assert w == sorted(w) and min(w) > 0 and np.mean(w) == pytest.approx(1.0, abs=2e-3)
    assert prior_weights(importance, 2.0, 0.1)[-1] > w[-1] and prior_weights(importance, -1.0, 0.1)[-1] < 1
    assert prior_weights([0.0] * 3, 1.0, 0.1) == [1.0] * 3
    assert all(len(f"{x:g}".replace(".", "").lstrip("0")) <= 3 for x in w)  # 3 significant digits


def test_an_exponent_resolved_better_replaces_the_plain_pool_with_its_weights():
    p = problem()
    importance, _ = layer_importance(p, POOL, "kl", None)
    solver = PoolPriorSolver(evaluator=aligned(importance["prefill"], 0.5, 0.05), kinds=KINDS)
    result = solver.solve(p)
    record = result.strategy.provenance["pool_prior"]
    assert record["chosen"] == "alpha=1" and record["versus_solved"]["alpha=1"]["high"] < 0
    assert weights_of(result.strategy) == prior_weights(importance["prefill"], 1.0, 0.1)
    for c in result.strategy.prefill:
        assert c.budget == 32 and make_pattern(c.pattern, **c.params).pool_identity() == POOL
    assert result.strategy.digest() == solver.trace.result.digest()
    assert set(record["weights"]) == {"plain-pool", "alpha=0.25", "alpha=0.5", "alpha=1"}


@pytest.mark.parametrize(("gain", "noise"), [(0.0005, 0.3), (-0.5, 0.05)], ids=["unresolved", "harmful"])
def test_without_a_resolved_gain_the_result_is_the_plain_pool_the_uniform_kvzip_model(gain, noise):
    p = problem()
    importance, _ = layer_importance(p, POOL, "kl", None)
    result = PoolPriorSolver(evaluator=aligned(importance["prefill"], gain, noise), kinds=KINDS).solve(p)
    assert result.strategy.provenance["pool_prior"]["chosen"] == "plain-pool"
    plain = UniformSolver(UniformSettings(pattern="kvzip[allocation=model]")).solve(p).strategy
    assert result.strategy.digest() == plain.digest()  # uniform kvzip[allocation=model] itself
    assert weights_of(result.strategy) == [1.0] * 6


def test_solve_pool_prior_end_to_end_and_a_rerun_measures_nothing(table_path, tmp_path, capsys):  # noqa: F811
    from polykv_search.cli import main

    ckpt, table = table_path
    out = tmp_path / "p.json"
    argv = ["solve", "--method", "pool-prior", "--signals", str(table), "--budget", "24", "--model", str(ckpt)]
    argv += ["--samples", "4", "--alphas", "1,3", "--progress", "false"]
    argv += ["--out", str(out)]
    assert main(argv) == 0
    record = json.loads(out.read_text())["provenance"]["pool_prior"]
    assert record["start"] == "plain-pool" and record["chosen"] in record["weights"]
    assert record["cost"]["strategy_runs"] == 12 and record["samples"]["n"] == 4
    assert "worst pattern" in record["importance_from"]
    captured = capsys.readouterr()
    report = " ".join(captured.out.split())
    assert "pool-prior: KL to FullKV on 4 calibration samples" in report
    assert "pool-prior cost: 3 strategies measured, 12 strategy runs and 4 FullKV references in " in report
    assert "strategy runs" in captured.err and (tmp_path / "p.json.journal").exists()
    assert main(argv) == 0
    again = json.loads(out.read_text())["provenance"]["pool_prior"]
    assert again["cost"]["strategy_runs"] == 0 and again["cost"]["values_from_journal"] == 12
    assert again["per_sample"] == record["per_sample"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--alphas", "0"], "alphas: give at least one exponent other than 0"),
        (["--alphas", "1,x"], "alphas: 'x' is not a number"),
        (["--pattern", "kvzip"], "pattern: a model-wide pool without a prior (allocation=model)"),
        (["--pattern", "kvzip[allocation=model,weight=2]"], "pattern: a model-wide pool without a prior"),
        (["--smoothing", "0"], "smoothing: must be in (0, 10]"),
        (["--guard", "4"], "--guard does not apply to pool-prior"),
        (["--prior", "floor", "--levels", "2"], "levels: each must be a number in (0, 1], got '2'"),
        (["--prior", "cap", "--levels", "0.5"], "levels: each must be a number in [1, 64], got '0.5'"),
        (["--prior", "weight", "--levels", "0.5"], "levels: weights take their exponents from alphas"),
        (["--prior", "floor", "--alphas", "0.5"], "alphas: exponents of weights; a floor takes its levels from levels"),
        (["--prior", "cap", "--alphas", "1"], "alphas: exponents of weights; a cap takes its levels from levels"),
        (["--prior", "size"], "prior"),
        (["--granularity", "head"], "granularity head: the signal table has no head cells of kvzip[allocation=model]"),
    ],
)
def test_bad_pool_prior_input_is_one_line_and_exit_2(table_path, tmp_path, capsys, extra, message):  # noqa: F811
    from polykv_search.cli import main

    _, table = table_path
    out = tmp_path / "p.json"
    argv = ["solve", "--method", "pool-prior", "--signals", str(table), "--budget", "24", "--out", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "p.json.journal").exists()


@pytest.mark.parametrize("prior", ["floor", "cap"])
def test_alphas_shape_weights_only_and_are_refused_with_floors_and_caps(prior):
    """Floors and caps are shaped by w(1) and graded by ``levels``: exponents given with them would be ignored, so
    they are refused; the default (auto) grid of each prior stays."""
    settings = get_solver_class("pool-prior").Settings
    with pytest.raises(SolverError, match=f"alphas: exponents of weights; a {prior} takes its levels from levels"):
        settings(prior=prior, alphas="0.5")
    assert settings(prior=prior).grid() == ([0.25, 0.5, 1.0] if prior == "floor" else [1.0, 2.0, 4.0])
    assert settings().grid() == [0.25, 0.5, 1.0] and settings(alphas="2,0.5").grid() == [2.0, 0.5]


def test_pool_prior_is_listed_and_cannot_be_the_searchs_start():
    assert get_solver_class("pool-prior") is PoolPriorSolver
    with pytest.raises(Exception, match="cannot be the start"):
        get_solver_class("search").Settings(start="pool-prior")


def test_a_table_whose_layers_are_all_alike_is_refused_before_anything_is_measured():
    p = problem()
    p.table._kl[:, :, p.table.patterns.index("kvzip")] = 0.25  # noqa: SLF001  (every layer costs the same)

    def evaluator(strategies):
        raise AssertionError("nothing should be measured")

    with pytest.raises(SolverError, match="every exponent gives the plain pool"):
        PoolPriorSolver(evaluator=evaluator, kinds=KINDS).solve(p)
