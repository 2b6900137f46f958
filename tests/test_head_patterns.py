"""Combined head-level strategies: prefill cells of scored patterns in the signal table (version 5), `collect
--head-patterns`, `show`, and ilp/dp --granularity head choosing keep-all or any (pattern, budget) per KV head."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from tiny import tiny_model

from polykv_search import scoring
from signals import SignalTable, SignalTableError
from signals.head_prefill_cells import PrefillCells
from signals.head_signals import HeadCells, HeadSignals
from solvers import Problem, SolverError, get_solver
from solvers.head_exact import cell_costs
from strategies import Strategy
from tests.head_tables import random_heads
from tests.test_solvers_heads import brute_force, head_budgets, labels

PATTERNS = ("streaming_llm", "snapkv", "h2o")


def heads_with(L, H, costs: dict[str, np.ndarray], budgets, *, se=None, context_len=1024) -> HeadSignals:
    """Head signals whose cells of each pattern have answer KL ``costs[pattern]`` ([L, H, nb]), prose KL 0;
    ``budgets``: one grid for all, or a dict pattern -> grid."""
    base = random_heads(L, H, context_len=context_len)
    grid = {p: tuple(budgets[p] if isinstance(budgets, dict) else budgets) for p in costs}

    def arrays(p):
        zero = np.zeros((L, H, len(grid[p])))
        err = zero + np.nan if se is None else se
        return (np.asarray(costs[p], dtype=float), err, zero, err)

    stream = HeadCells(4, grid["streaming_llm"], *arrays("streaming_llm")) if "streaming_llm" in costs else None
    scored = tuple(PrefillCells(p, grid[p], *arrays(p)) for p in costs if p != "streaming_llm")
    return HeadSignals(base.retrieval, base.provenance, stream, scored)


def table_of(heads: HeadSignals) -> SignalTable:
    L = heads.retrieval.mean.shape[0]
    t = SignalTable.empty(L, ["prefill"], ["snapkv"], [8], {"model": "tiny"})
    t.set_heads(heads)
    return t


def random_costs(L, H, nb, seed):
    rng = np.random.default_rng(seed)
    decay = 0.5 ** np.arange(nb)
    return {p: rng.gamma(0.8, 1.0, (L, H, 1)) * decay * rng.uniform(0.5, 1.5, (L, H, nb)) for p in PATTERNS}


# ------------------------------------------------------------------------------------------ table
def test_prefill_cells_round_trip_as_version_5_and_older_versions_are_unchanged():
    rng = np.random.default_rng(0)
    heads = heads_with(2, 3, random_costs(2, 3, 2, 0), (16, 32), se=rng.uniform(0, 0.1, (2, 3, 2)))
    t = table_of(heads)
    doc = t.to_json()
    assert doc["version"] == 5 and [b["pattern"] for b in doc["heads"]["prefill_cells"]] == ["snapkv", "h2o"]
    assert sorted(doc["heads"]["prefill_cells"][0]) == [
        "budgets",
        "kl_answer",
        "kl_prose",
        "params",
        "pattern",
        "provenance",
    ]
    back = SignalTable.loads(t.dumps())
    assert back == t and back.dumps() == t.dumps() and back.heads.prefill_cells[1].pattern == "h2o"
    assert [c.pattern for c in back.heads.cell_sets] == list(PATTERNS)
    only_scored = table_of(heads_with(2, 3, {"h2o": np.ones((2, 3, 2))}, (16, 32)))
    assert SignalTable.loads(only_scored.dumps()) == only_scored and only_scored.heads.cells is None
    streaming_only = table_of(heads_with(2, 3, {"streaming_llm": np.ones((2, 3, 2))}, (16, 32)))
    assert streaming_only.to_json()["version"] == 4  # as before: a version-4 reader keeps reading it


def _edit(i, key, value):
    def edit(doc):
        block = doc["heads"]["prefill_cells"][i]
        if value is KeyError:
            del block[key]
        else:
            block[key] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_edit(0, "pattern", "tova"), r"heads\.prefill_cells\[0\]\.pattern: must be one of \['snapkv'"),
        (_edit(1, "pattern", "streaming_llm"), r"heads\.prefill_cells\[1\]\.pattern: must be one of"),
        (_edit(1, "pattern", "snapkv"), r"heads\.prefill_cells\[1\]\.pattern: 'snapkv' appears twice"),
        (_edit(0, "params", {"window": 0}), r"heads\.prefill_cells\[0\]\.params: .*window"),
        (_edit(0, "params", {"nope": 1}), r"heads\.prefill_cells\[0\]\.params: "),
        (_edit(0, "budgets", [32, 16]), r"heads\.prefill_cells\[0\]\.budgets: must be strictly increasing"),
        (_edit(1, "provenance", KeyError), r"heads\.prefill_cells\[1\]: expected an object with the keys budgets"),
        (_edit(0, "kl_answer", {"mean": [[[0.1, 0.1]] * 3] * 2}), r"heads\.prefill_cells\[0\]\.kl_answer: expected"),
        (_edit(0, "kl_prose", {"mean": [[[-1.0, 0.1]] * 3] * 2, "se": None}), r"prefill_cells\[0\]\.kl_prose\.mean"),
    ],
)
def test_bad_prefill_cells_are_refused_naming_the_field(edit, message):
    doc = table_of(heads_with(2, 3, random_costs(2, 3, 2, 0), (16, 32))).to_json()
    edit(doc)
    with pytest.raises(SignalTableError, match=message):
        SignalTable.from_json(copy.deepcopy(doc))


def test_prefill_cells_in_a_version_4_table_are_refused():
    doc = table_of(heads_with(2, 3, random_costs(2, 3, 2, 0), (16, 32))).to_json()
    doc["version"] = 4
    with pytest.raises(SignalTableError, match=r"^heads: unknown keys \['prefill_cells'\] for version 4"):
        SignalTable.from_json(doc)


# ---------------------------------------------------------------------------------------- solvers
def test_a_known_optimum_one_full_head_and_two_h2o_heads():
    # L = 1, H = 3, n = 1024, B = 384: 3 * 384 = 1152 head tokens = 1024 + 64 + 64. Head 0 costs 10 in every
    # cell, so it keeps all; heads 1 and 2 then get 64 tokens each, where h2o (0.01) beats snapkv and streaming.
    # h2o@128 (0.001) is cheaper still but does not fit beside a full head.
    costs = {
        "streaming_llm": [[[10.0, 9.0], [0.5, 0.4], [0.6, 0.3]]],
        "snapkv": [[[10.0, 9.0], [0.02, 0.002], [0.03, 0.002]]],
        "h2o": [[[10.0, 9.0], [0.01, 0.001], [0.01, 0.001]]],
    }
    table = table_of(heads_with(1, 3, costs, (64, 128)))
    problem = Problem(global_budget=384, table=table, b_min=16)
    for method in ("ilp", "dp"):
        result = get_solver(method, granularity="head").solve(problem)
        s = result.strategy
        assert labels(s) == labels(s, "decoding") == [["full@1024[0]", "h2o@64[1,2]"]]
        assert result.objective == pytest.approx(0.02) and s.budgets("prefill") == [384]
        assert "1 keep all 1024 tokens; h2o@64 2 of 3 KV heads" in result.message
        assert [k["pattern"] for k in s.provenance["head_cells"]] == list(PATTERNS)
        assert s.provenance["head_cells"][0]["phases"] == ["prefill", "decoding"]
        assert s.provenance["head_cells"][2]["phases"] == ["prefill"]
    # with the streaming cells alone the same budget buys one full head and two streaming heads
    alone = get_solver("dp", granularity="head", head_patterns="streaming_llm").solve(problem)
    assert labels(alone.strategy) == [["full@1024[0]", "streaming_llm@64[1,2]"]]
    assert alone.strategy.head_groups(0, "prefill")[1].params == {"n_sink": 4}
    # more budget: heads 1 and 2 move to h2o@128 (1024 + 2 * 128 = 1280 <= 3 * 427)
    more = get_solver("ilp", granularity="head").solve(Problem(global_budget=427, table=table, b_min=16))
    assert labels(more.strategy) == [["full@1024[0]", "h2o@128[1,2]"]]


@pytest.mark.parametrize("seed", range(8))
def test_ilp_and_dp_find_the_brute_force_optimum_over_several_patterns(seed):
    rng = np.random.default_rng(seed)
    L, H = (1, 3) if seed % 2 else (2, 2)
    budgets = {p: (8, 16, 32) for p in PATTERNS}
    costs = random_costs(L, H, 3, seed)
    if seed % 3 == 0:  # patterns measured at other budgets: the grid is the union
        costs["snapkv"], budgets["snapkv"] = costs["snapkv"][..., [0, 2]], (8, 32)
        costs["h2o"], budgets["h2o"] = costs["h2o"][..., [1]], (16,)
    table = table_of(heads_with(L, H, costs, budgets, context_len=64))
    problem = Problem(global_budget=float(rng.integers(8, 48)), table=table, b_min=8)
    settings = get_solver("dp", granularity="head").settings
    cost, patterns, grid, _ = cell_costs(problem, settings, "dp")
    assert patterns[0] == "full" and grid == (8, 16, 32, 64)
    optimum = brute_force(cost, grid, H * problem.total)
    results = {m: get_solver(m, granularity="head").solve(problem) for m in ("ilp", "dp")}
    for r in results.values():
        assert r.objective == pytest.approx(optimum, abs=1e-9)
    assert labels(results["ilp"].strategy) == labels(results["dp"].strategy)


@pytest.mark.parametrize("seed", range(6))
def test_ilp_and_dp_agree_on_larger_multi_pattern_tables(seed):
    rng = np.random.default_rng(50 + seed)
    L, H = int(rng.integers(3, 10)), int(rng.integers(2, 4))
    costs = random_costs(L, H, 3, seed)
    se = rng.uniform(0, 0.2, (L, H, 3)) if seed % 2 else None
    table = table_of(heads_with(L, H, costs, (32, 64, 128), se=se, context_len=512))
    settings = {"granularity": "head", "noise": ("auto", "clip", "upper")[seed % 3]}
    if seed % 3 == 1:
        settings["max_distinct_budgets"] = 2
    problem = Problem(global_budget=float(rng.integers(40, 300)), table=table, b_min=32)
    ilp, dp = (get_solver(m, **settings).solve(problem) for m in ("ilp", "dp"))
    assert ilp.objective == pytest.approx(dp.objective, rel=1e-9, abs=1e-9)
    assert labels(ilp.strategy) == labels(dp.strategy)
    b = head_budgets(ilp.strategy)
    assert b.sum() <= H * problem.total and b.min() >= 32 and set(np.unique(b)) <= {32, 64, 128, 512}
    used = {g.pattern for layer in range(L) for g in ilp.strategy.head_groups(layer, "prefill")}
    assert used <= {"full", *PATTERNS}
    # the combined choice is never worse than any one pattern alone
    for p in PATTERNS:
        one = get_solver("dp", **settings, head_patterns=p).solve(problem)
        assert dp.objective <= one.objective + 1e-12


def test_head_patterns_setting_names_what_the_table_has():
    table = table_of(heads_with(1, 3, random_costs(1, 3, 2, 0), (64, 128)))
    with pytest.raises(
        SolverError, match=r"head_patterns: 'tova' must name distinct patterns .*streaming_llm,snapkv,h2o"
    ):
        get_solver("ilp", granularity="head", head_patterns="tova").solve(Problem(global_budget=384, table=table))


def test_solve_cli_chooses_among_patterns_and_prints_the_choice(tmp_path, capsys):
    from polykv_search.cli import main

    costs = {
        "streaming_llm": [[[10.0, 9.0], [0.5, 0.4], [0.6, 0.3]]],
        "h2o": [[[10.0, 9.0], [0.01, 0.001], [0.01, 0.001]]],
    }
    path = table_of(heads_with(1, 3, costs, (64, 128))).save(tmp_path / "t.json")
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "dp", "--granularity", "head", "--signals", str(path), "--budget", "384"]
    assert main([*argv, "--b-min", "16", "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().err.split())
    assert "head level (streaming_llm,h2o cells): 1 keep all 1024 tokens; h2o@64 2 of 3 KV heads" in printed
    assert labels(Strategy.load(out)) == [["full@1024[0]", "h2o@64[1,2]"]]
    bad = tmp_path / "bad.json"
    assert main([*argv, "--head-patterns", "snapkv", "--out", str(bad)]) == 2 and not bad.exists()
    assert "head_patterns: 'snapkv'" in capsys.readouterr().err


# -------------------------------------------------------------------------- collect, show, score
def collect_argv(tmp_path) -> list[str]:
    """``collect`` of head cells at budgets 16,32 on a saved two-layer tiny model (no ``--head-patterns``)."""
    from test_retrieval_calibration import char_tokenizer

    ckpt = tmp_path / "tiny"
    model = tiny_model("llama", layers=2)
    model.save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(f"The {m} path went on for mile {i}. Nobody said much." for m in "abcdef" for i in range(40))
    )
    argv = ["collect", "--model", str(ckpt), "--calib", str(corpus), "--samples", "2", "--context-len", "300"]
    argv += ["--continuation-len", "48", "--patterns", "snapkv", "--budgets", "64", "--phases", "prefill"]
    return argv + ["--layers", "0", "--no-progress", "--retrieval-heads", "2", "--head-cells", "16,32"]


def test_collect_head_patterns_then_show_and_solve_on_a_tiny_model(tmp_path, capsys):
    from test_collect_cli import run_cli

    argv = collect_argv(tmp_path)
    out = tmp_path / "signals.json"
    assert run_cli([*argv, "--head-patterns", "streaming_llm,snapkv,h2o", "--out", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "streaming cells: budgets 16,32" in err and "snapkv prefill cells: budgets 16,32" in err
    assert json.loads(out.read_text())["version"] == 5
    heads = SignalTable.load(out).heads
    assert [c.pattern for c in heads.cell_sets] == list(PATTERNS)
    for c in heads.prefill_cells:
        assert c.budgets == (16, 32) and c.params == {} and c.kl_answer_mean.shape == (2, 2, 2)
        assert (c.kl_answer_mean >= 0).all() and np.isfinite(c.kl_prose_se).all() and c.provenance["seconds"] > 0
        assert c.provenance["evidence"] == heads.provenance and c.provenance["prose_samples"] == 2
    assert not np.allclose(heads.prefill_cells[0].kl_prose_mean, heads.prefill_cells[1].kl_prose_mean)
    assert run_cli(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "h2o (prefill)" in shown and "streaming_llm (both)" in shown and "cheapest pattern per KV head" in shown
    assert all(len(line) <= 80 for line in shown.splitlines() if line.startswith(("  ", "head cells")))
    collected = SignalTable.load(out)
    for method in ("ilp", "dp"):
        s = get_solver(method, granularity="head").solve(Problem(global_budget=40, table=collected, b_min=8)).strategy
        assert s.context_len == 300 and Strategy.from_json(s.to_json()).to_json() == s.to_json()
        assert {g.pattern for layer in range(2) for g in s.head_groups(layer, "decoding")} <= {"full", *PATTERNS}
    # rerun: nothing measured; fewer patterns: the others are dropped without measuring
    assert run_cli([*argv, "--head-patterns", "streaming_llm,snapkv,h2o", "--out", str(out)]) == 0
    assert "cells: budgets" not in capsys.readouterr().err and SignalTable.load(out).heads == heads
    assert run_cli([*argv, "--head-patterns", "h2o", "--out", str(out)]) == 0
    again = SignalTable.load(out).heads
    assert (
        "cells: budgets" not in capsys.readouterr().err
        and again.cells is None
        and again.prefill_cells == heads.prefill_cells[1:]
    )
    for extra, message in [
        (["--head-patterns", "tova"], "--head-patterns: 'tova' has no head cells"),
        (["--head-patterns", "h2o,h2o"], "repeated pattern"),
    ]:
        bad = tmp_path / "bad.json"
        assert run_cli([*argv, *extra, "--out", str(bad)]) == 2 and not bad.exists()
        assert message in capsys.readouterr().err
    no_cells = [a for a in argv if a not in ("--head-cells", "16,32")]
    assert run_cli([*no_cells, "--head-patterns", "h2o", "--out", str(tmp_path / "bad.json")]) == 2
    assert "give --head-cells BUDGETS too" in capsys.readouterr().err


def test_a_combined_strategy_applies_and_scores_like_the_per_entry_path():
    """Groups of different scored patterns in one layer (runtime head_group_layer): the strategy the solver
    writes from a multi-pattern table scores the same on the shared engine and the per-entry path."""
    L, H = 3, 2
    big, small = 10.0, 0.01
    costs = {p: np.full((L, H, 2), big) for p in PATTERNS}
    costs["h2o"][0, 1] = small  # layer 0: head 0 keeps all, head 1 h2o
    costs["snapkv"][1] = small  # layer 1: both snapkv
    costs["streaming_llm"][2, 0], costs["snapkv"][2, 1] = small, small  # layer 2: streaming + snapkv
    table = table_of(heads_with(L, H, costs, (16, 32), context_len=512))
    result = get_solver("ilp", granularity="head").solve(Problem(global_budget=110, table=table, b_min=8))
    s = result.strategy
    assert [[g.pattern for g in s.head_groups(layer, "prefill")] for layer in range(L)] == [
        ["full", "h2o"],
        ["snapkv"],
        ["streaming_llm", "snapkv"],
    ]
    assert_engines_agree(s)


def assert_engines_agree(strategy: Strategy) -> None:
    """``strategy`` beside FullKV on a tiny llama: the shared engine scores as the per-entry path, and the
    strategy holds fewer KV bytes and drifts from FullKV (KL > 0)."""
    from tests.test_eval_support import char_tokenizer, haystack_texts

    model, tok = tiny_model("llama"), char_tokenizer()
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=300, seed=0)
    full = scoring.Entry("full", Strategy.full(strategy.num_layers), "baseline", "full")
    es = [full, scoring.Entry("s", strategy, "strategy", "s")]
    shared = scoring.score_entries(model, tok, es, samples, engine="shared", max_new_tokens=6)
    per = scoring.score_entries(model, tok, es, samples, engine="per-entry", max_new_tokens=6)
    for a, b in zip(shared, per):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
    assert shared[1]["kv_bytes"] < shared[0]["kv_bytes"]
    assert shared[1]["extra"]["broad/continuation"]["kl"] > 0
