"""Head-level solvers: the duo and headkv baselines, and ilp/dp at head granularity (exact, agreeing)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from polykv_search.cli import main
from signals import random_signal_table
from solvers import Problem, SolverError, get_solver
from solvers.duo import fit
from solvers.head_exact import cell_costs
from solvers.heads import head_cells
from strategies import PHASES, Strategy
from tests.head_tables import cells_block, random_heads, table_with_heads


def labels(strategy: Strategy, phase: str = "prefill") -> list[list[str]]:
    return [[g.label() for g in strategy.head_groups(layer, phase)] for layer in range(strategy.num_layers)]


def head_budgets(strategy: Strategy, phase: str = "prefill") -> np.ndarray:
    """[L, H] budget of every KV head."""
    out = np.zeros((strategy.num_layers, strategy.num_kv_heads), dtype=int)
    for layer in range(strategy.num_layers):
        for g in strategy.head_groups(layer, phase):
            out[layer, list(g.heads)] = g.budget
    return out


# ------------------------------------------------------------------------------------------- duo
def test_duo_by_hand():
    # N = 6 heads, T = 3 * floor(2 * 64) = 384, n = 256, floor f = 4 + 12 = 16:
    # k = (384 - 6*16) // (256 - 16) = 1; s = (384 - 256) // 5 = 25
    scores = np.array([[0.5, 0.1, 0.0], [0.9, 0.0, 0.2]])
    table = table_with_heads(2, 3, cells=False, context_len=256, scores=scores)
    result = get_solver("duo", min_recent=12).solve(Problem(global_budget=64, table=table, b_min=8))
    s = result.strategy
    assert labels(s) == labels(s, "decoding") == [["streaming_llm@25[0,1,2]"], ["full@256[0]", "streaming_llm@25[1,2]"]]
    assert s.budgets("prefill") == [25, 102] and s.context_len == 256 and s.num_kv_heads == 3
    assert result.unused_budget == {"prefill": 1, "decoding": 1}
    assert s.head_groups(1, "prefill")[1].params == {"n_sink": 4}
    assert s.provenance["duo"]["full_heads"] == 1 and s.version == 2
    fixed = get_solver("duo", min_recent=12, full_heads=0).solve(Problem(global_budget=64, table=table, b_min=8))
    assert labels(fixed.strategy) == [["streaming_llm@64[0,1,2]"]] * 2
    with pytest.raises(SolverError, match=r"full_heads: 2 full KV heads leave the streaming heads less than 16"):
        get_solver("duo", min_recent=12, full_heads=2).solve(Problem(global_budget=64, table=table, b_min=8))


@pytest.mark.parametrize("seed", range(30))
def test_duo_fitting_rule_on_random_instances(seed):
    rng = np.random.default_rng(seed)
    N, n = int(rng.integers(1, 40)), int(rng.integers(20, 2000))
    floor = int(rng.integers(1, n))
    total = int(rng.integers(N * floor, N * n + 50))
    k, s = fit(N, total, n, floor)
    if s is None:
        assert k == N and N * n <= total
        return
    assert 0 <= k < N and floor <= s < n
    assert k * n + (N - k) * s <= total < k * n + (N - k) * (s + 1)  # what is left is split evenly
    assert k == N - 1 or (k + 1) * n + (N - k - 1) * floor > total  # k is as large as B allows


def test_duo_small_budgets_stream_every_head():
    table = table_with_heads(3, 3, cells=False, context_len=512)
    s = get_solver("duo").solve(Problem(global_budget=24, table=table, b_min=4)).strategy
    assert labels(s) == [["streaming_llm@24[0,1,2]"]] * 3


# ---------------------------------------------------------------------------------------- headkv
def test_headkv_by_hand():
    # T = 384, floor 16: head (0, 0) takes the whole pool (16 + 288), capped at n = 256; the 48 left go
    # evenly to the others (25.6 each): largest remainder, ties to the lower index -> 26, 26, 26, 25, 25
    scores = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    table = table_with_heads(2, 3, cells=False, context_len=256, scores=scores)
    result = get_solver("headkv").solve(Problem(global_budget=64, table=table, b_min=8))
    assert labels(result.strategy) == [["snapkv@256[0]", "snapkv@26[1,2]"], ["snapkv@26[0]", "snapkv@25[1,2]"]]
    assert labels(result.strategy, "decoding") == labels(result.strategy)
    assert result.unused_budget == {"prefill": 0.0, "decoding": 0.0}


@pytest.mark.parametrize("seed", range(8))
def test_headkv_budgets_sum_to_the_total_above_the_floor_in_score_order(seed):
    rng = np.random.default_rng(seed)
    L, H, B = int(rng.integers(2, 8)), int(rng.integers(1, 5)), float(rng.integers(16, 200))
    table = table_with_heads(L, H, seed=seed, cells=False, context_len=512)
    pattern = ("snapkv", "streaming_llm")[seed % 2]
    s = get_solver("headkv", pattern=pattern, floor_share=0.3).solve(Problem(global_budget=B, table=table)).strategy
    b = head_budgets(s)
    floor = max(1, int(0.3 * B))
    assert b.sum() == H * int(L * B) and b.min() >= floor and b.max() <= 512
    scores = table.heads.retrieval.mean
    order = np.argsort(-scores.reshape(-1), kind="stable")
    assert np.all(np.diff(b.reshape(-1)[order]) <= 1)  # a higher score never gets (more than rounding) less
    assert {g.pattern for layer in range(L) for g in s.head_groups(layer, "prefill")} == {pattern}


def test_head_baselines_name_the_missing_signal_and_the_collect_option(tmp_path, capsys):
    table = random_signal_table(3, budgets=(8, 16, 32), seed=1)
    for name in ("duo", "headkv"):
        with pytest.raises(SolverError, match=r"no retrieval-head scores; collect them with .*--retrieval-heads"):
            get_solver(name).solve(Problem(global_budget=16, table=table))
    path = table.save(tmp_path / "t.json")
    assert (
        main(["solve", "--method", "duo", "--signals", str(path), "--budget", "16", "--out", str(tmp_path / "s")]) == 2
    )
    assert "--retrieval-heads" in capsys.readouterr().err


def test_solve_cli_writes_head_level_baselines(tmp_path):
    table = random_signal_table(4, budgets=(8, 16, 32), seed=2)
    table.set_heads(random_heads(4, 3, seed=2, context_len=300))
    path = table.save(tmp_path / "t.json")
    for method, extra in (("duo", ["--min-recent", "20"]), ("headkv", ["--pattern", "streaming_llm"])):
        out = tmp_path / f"{method}.json"
        argv = ["solve", "--method", method, "--signals", str(path), "--budget", "64", "--out", str(out)]
        assert main(argv + extra) == 0
        s = Strategy.load(out)
        assert s.version == 2 and s.context_len == 300 and s.num_kv_heads == 3
        assert sum(s.budgets("prefill")) <= 4 * 64 and s.provenance["solver"] == method
    out = tmp_path / "n.json"
    argv = ["solve", "--method", "duo", "--signals", str(path), "--budget", "64", "--target-context-len", "1000"]
    assert main(argv + ["--out", str(out)]) == 0 and Strategy.load(out).context_len == 1000


# ------------------------------------------------------------------------------- head-level ilp/dp
def brute_force(cost: np.ndarray, grid, total: int) -> float:
    """The optimum over every (pattern, budget) per item, by enumeration."""
    best = np.inf
    options = [(p, g) for p in range(cost.shape[1]) for g in range(len(grid))]
    for pick in itertools.product(options, repeat=cost.shape[0]):
        if sum(grid[g] for _, g in pick) <= total:
            best = min(best, sum(cost[i, p, g] for i, (p, g) in enumerate(pick)))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_head_level_ilp_and_dp_find_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    L, H = int(rng.integers(1, 3)), 2
    table = table_with_heads(L, H, seed=seed, context_len=64, budgets=(8, 16, 32))
    B = float(rng.integers(8, 48))
    problem = Problem(global_budget=B, table=table, b_min=8)
    results = {m: get_solver(m, granularity="head").solve(problem) for m in ("ilp", "dp")}
    cost, patterns, grid, _ = cell_costs(problem, get_solver("dp", granularity="head").settings, "dp")
    assert patterns == ["full", "streaming_llm"]
    optimum = brute_force(cost, grid, H * problem.total)
    for r in results.values():
        assert r.objective == pytest.approx(optimum, abs=1e-9)
        assert r.strategy.has_head_groups and labels(r.strategy) == labels(r.strategy, "decoding")
    assert head_budgets(results["ilp"].strategy).sum() == head_budgets(results["dp"].strategy).sum()


@pytest.mark.parametrize("seed", range(10))
def test_head_level_ilp_and_dp_agree_on_random_tables(seed):
    rng = np.random.default_rng(100 + seed)
    L, H = int(rng.integers(3, 12)), int(rng.integers(1, 5))
    table = table_with_heads(L, H, seed=seed, context_len=512, budgets=(16, 32, 64, 128))
    B = float(rng.integers(16, 200))
    settings = {"granularity": "head", "head_signal": ("answer", "prose", "sum")[seed % 3]}
    settings["noise"] = ("auto", "clip", "interval", "upper")[seed % 4]
    if seed % 5 == 0:
        settings["max_distinct_budgets"] = 2
    problem = Problem(global_budget=B, table=table, b_min=16)
    ilp = get_solver("ilp", **settings).solve(problem)
    dp = get_solver("dp", **settings).solve(problem)
    assert ilp.objective == pytest.approx(dp.objective, rel=1e-9, abs=1e-9)
    assert sum(ilp.strategy.budgets("prefill")) == pytest.approx(sum(dp.strategy.budgets("prefill")))
    b = head_budgets(ilp.strategy)
    assert b.sum() <= H * problem.total and b.min() >= 16
    assert set(np.unique(b)) <= {16, 32, 64, 128, 512}
    if "max_distinct_budgets" in settings:
        assert len(np.unique(b)) <= 2


def test_head_level_costs_follow_the_noise_rule_by_hand():
    block = cells_block(1, 2, (8, 16), seed=0)
    block["kl_answer"] = {"mean": [[[0.5, 0.1], [-0.2, 0.0]]], "se": [[[0.1, 0.1], [0.05, None]]]}
    block["kl_prose"] = {"mean": [[[0.0, 0.0], [0.0, 0.0]]], "se": None}
    table = table_with_heads(1, 2, cells=block, context_len=64, budgets=(8, 16))
    problem = Problem(global_budget=16, table=table, b_min=8)
    z = 1.959963984540054
    for noise, want in (
        ("clip", [[0.5, 0.1], [0.0, 0.0]]),
        ("upper", [[0.5 + 0.1 * z, 0.1 + 0.1 * z], [max(-0.2 + 0.05 * z, 0), 0.0]]),
        ("interval", [[0.5, 0.0], [0.0, 0.0]]),
    ):
        settings = get_solver("dp", granularity="head", head_signal="answer", noise=noise).settings
        cost, patterns, grid, facts = cell_costs(problem, settings, "dp")
        assert grid == (8, 16, 64) and facts["noise"] == noise and patterns == ["full", "streaming_llm"]
        np.testing.assert_allclose(cost[:, 1, :2], want, atol=1e-9)
        assert np.all(cost[:, 0, 2] == 0) and np.all(cost[:, 0, :2] == np.inf)  # keep-all, only at n
        assert np.all(cost[:, 1, 2] == np.inf)


def test_head_granularity_without_cells_names_the_collect_option(tmp_path, capsys):
    table = random_signal_table(3, budgets=(8, 16, 32), seed=1)
    table.set_heads(random_heads(3, 2))
    assert head_cells(table) is None and head_cells(random_signal_table(3, budgets=(8, 16), seed=1)) is None
    for method in ("ilp", "dp"):
        with pytest.raises(SolverError, match=r"no head cells; collect them with `polykv-search collect --head-cells"):
            get_solver(method, granularity="head").solve(Problem(global_budget=16, table=table))
    path = table.save(tmp_path / "t.json")
    argv = ["solve", "--method", "ilp", "--granularity", "head", "--signals", str(path), "--budget", "16"]
    assert main(argv + ["--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert "--head-cells" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "s.json").exists()


def test_head_granularity_refuses_the_layer_ablations_and_other_objectives():
    table = table_with_heads(2, 2, context_len=64, budgets=(8, 16))
    with pytest.raises(SolverError, match="ablations"):
        get_solver("dp", granularity="head").solve(Problem(global_budget=16, table=table, fixed_pattern="tova"))
    with pytest.raises(SolverError, match="head cells carry KL only"):
        get_solver("ilp", granularity="head", objective="dppl").solve(Problem(global_budget=16, table=table))


def test_layer_granularity_is_unchanged_by_a_heads_block():
    plain = random_signal_table(4, budgets=(8, 16, 32, 64), seed=5)
    with_heads = table_with_heads(4, 3, seed=5)
    for method in ("ilp", "dp"):
        a = get_solver(method).solve(Problem(global_budget=24, table=plain)).strategy
        b = get_solver(method).solve(Problem(global_budget=24, table=with_heads)).strategy
        assert a.to_json()["layers"] == b.to_json()["layers"] and a.version == 1
    for phase in PHASES:
        assert all(isinstance(x, int) for x in a.budgets(phase))


def test_the_solvers_read_the_cells_the_collector_stores():
    from signals.head_signals import HeadCells as CollectedCells
    from signals.head_signals import HeadSignals

    table = table_with_heads(3, 2, cells=False)
    rng = np.random.default_rng(0)
    arrays = [rng.random((3, 2, 2)) for _ in range(4)]
    collected = CollectedCells(4, (16, 32), *arrays)
    table.set_heads(HeadSignals(table.heads.retrieval, table.heads.provenance, collected))
    cells = head_cells(table)
    assert cells.budgets == (16, 32) and cells.pattern == "streaming_llm"
    np.testing.assert_array_equal(cells.mean["kl_answer"], arrays[0])
    np.testing.assert_array_equal(cells.se["kl_prose"], arrays[3])


# ------------------------------------------------------------------- phases the table lacks
HEAD_METHODS = (
    ("duo", {"min_recent": 12}),
    ("headkv", {}),
    ("ilp", {"granularity": "head"}),
    ("dp", {"granularity": "head"}),
)


def prefill_only_table(L: int = 4, H: int = 3, seed: int = 3):
    """A table collected for prefill only (the default ``collect``), with retrieval scores and head cells."""
    table = random_signal_table(L, phases=("prefill",), budgets=(8, 16, 32, 64), seed=seed)
    both = table_with_heads(L, H, seed=seed)
    table.set_heads(both.heads)
    return table, both


@pytest.mark.parametrize("method,settings", HEAD_METHODS)
def test_with_a_prefill_only_table_decoding_gets_prefills_head_groups(method, settings):
    table, both = prefill_only_table()
    result = get_solver(method, **settings).solve(Problem(global_budget=48, table=table, b_min=8))
    s = result.strategy
    assert Strategy.from_json(s.to_json()).to_json() == s.to_json()
    assert list(s.decoding) == list(s.prefill) and labels(s, "decoding") == labels(s, "prefill")
    assert any(c.head_groups for c in s.decoding)  # not the uniform layer-level default
    assert s.provenance["phases_optimized"] == ["prefill"] and s.provenance["phases_following"] == {
        "decoding": "prefill"
    }
    assert result.message.endswith("decoding follows prefill's head groups (decoding not in the signal table)")
    assert [c.optimized for c in result.choices if c.phase == "decoding"] == [False] * 4
    # the same heads as when the table has both phases (the head signals do not depend on the phase)
    full = get_solver(method, **settings).solve(Problem(global_budget=48, table=both, b_min=8)).strategy
    assert list(full.prefill) == list(s.prefill) == list(full.decoding)
    assert "phases_following" not in full.provenance


def test_layer_level_solvers_keep_the_uniform_default_for_a_phase_the_table_lacks():
    table, _ = prefill_only_table()
    s = get_solver("ilp").solve(Problem(global_budget=24, table=table)).strategy
    assert [(c.pattern, c.budget) for c in s.decoding] == [("snapkv", 24)] * 4
    assert "phases_following" not in s.provenance


def test_solve_cli_prints_that_decoding_follows_prefill(tmp_path, capsys):
    from signals.head_signals import HeadCells as CollectedCells
    from signals.head_signals import HeadSignals

    table, _ = prefill_only_table()
    block = cells_block(4, 3, (16, 32, 64), seed=3)
    arrays = [np.asarray(block[k][part]) for k in ("kl_answer", "kl_prose") for part in ("mean", "se")]
    table.set_heads(
        HeadSignals(table.heads.retrieval, table.heads.provenance, CollectedCells(4, (16, 32, 64), *arrays))
    )
    path = table.save(tmp_path / "t.json")
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "ilp", "--granularity", "head", "--signals", str(path), "--budget", "48"]
    assert main(argv + ["--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().err.split())  # the console (stderr) wraps lines
    assert "decoding follows prefill's head groups (decoding not in the signal table)" in printed
    s = Strategy.load(out)
    assert list(s.decoding) == list(s.prefill)


def test_streaming_cells_keep_the_collectors_sink():
    from signals.head_signals import HeadCells as CollectedCells
    from signals.head_signals import HeadSignals

    table = table_with_heads(3, 2, cells=False)
    arrays = [np.random.default_rng(1).random((3, 2, 2)) for _ in range(4)]
    table.set_heads(HeadSignals(table.heads.retrieval, table.heads.provenance, CollectedCells(2, (16, 32), *arrays)))
    assert head_cells(table).params == {"n_sink": 2}
    s = get_solver("ilp", granularity="head").solve(Problem(global_budget=40, table=table, b_min=8)).strategy
    streaming = [g for layer in range(3) for g in s.head_groups(layer, "prefill") if g.pattern == "streaming_llm"]
    assert streaming and all(g.params == {"n_sink": 2} for g in streaming)
