"""KVzip's pooled allocation at head level: single-KV-head groups given ``kvzip[allocation=model]`` form one
pool over every layer (each head at its own budget, the pool's total their sum), against the oracle; the
head-level solvers give such heads a group each, and the strategy scores alike on both engines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import tiny_model

from signals.head_prefill_cells import PrefillCells
from solvers import Problem, get_solver
from strategies import Strategy
from strategies.head_groups import group_heads
from tests.test_head_groups import close, run_both
from tests.test_head_patterns import assert_engines_agree, heads_with, table_of
from tests.test_kvzip_pooled import held, oracle_held
from tests.tiny import FAMILIES

MODEL = {"allocation": "model", "n_sink": 2}


def both(head: int, name: str, budget: int | None, params: dict) -> tuple:
    """A single-head group with the same plan in both phases (decoding follows prefill, as the solvers write)."""
    return ((head,), (name, budget, params), (name, budget, params))


POOLED = {  # layer -> head groups
    0: [both(0, "full", None, {}), both(1, "kvzip", 14, MODEL)],
    1: [both(0, "kvzip", 10, MODEL), both(1, "kvzip", 20, MODEL)],
    2: [both(0, "snapkv", 12, {"window": 4}), both(1, "kvzip", 18, MODEL)],
}
POOL = [(0, 1), (1, 0), (1, 1), (2, 1)]  # (layer, KV head) cells of the pool


@pytest.mark.parametrize("family", FAMILIES)
def test_single_head_groups_pool_over_layers_and_keep_the_oracles_tokens(family):
    model = tiny_model(family, layers=3, seed=9)
    fast, ref, cache, oracle, mask, _ = run_both(model, Strategy.full(3), POOLED)
    got = held(cache)  # (layer, row, KV head) -> positions held (padding slots left out)
    assert got == oracle_held(oracle, cache)
    assert close(fast[0], ref[0], mask)  # prefill logits; then the continuation and every decoding step
    assert all(torch.allclose(a, b, atol=2e-5, rtol=1e-4) for a, b in zip(fast[1:], ref[1:]))
    for row in range(2):  # the pool holds its total (14 + 10 + 20 + 18) through decoding, heads unevenly
        counts = [len(got[layer, row, head]) for layer, head in POOL]
        assert sum(counts) == 62 and counts != [14, 10, 20, 18]


def test_group_heads_gives_heads_for_which_alone_holds_a_group_each():
    row = [("kvzip", 8, MODEL), ("kvzip", 8, MODEL), ("h2o", 8, {}), ("h2o", 8, {})]
    assert [g.heads for g in group_heads(row)] == [(0, 1), (2, 3)]
    split = group_heads(row, alone=lambda pattern, params: pattern == "kvzip")
    assert [g.heads for g in split] == [(0,), (1,), (2, 3)]


def pooled_solve(method: str):
    """A 3-layer, 2-head table where the solve keeps layer 0, gives layer 1 to kvzip's pool and splits
    layer 2 between the pool and h2o; ``method``'s result."""
    L, H, budgets, big, small = 3, 2, (16, 32), 10.0, 0.01
    costs = {p: np.full((L, H, 2), big) for p in ("h2o", "kvzip")}
    costs["kvzip"][1] = small  # layer 1: both heads kvzip at the same budget, still a group each
    costs["kvzip"][2, 0] = costs["h2o"][2, 1] = small  # layer 2: kvzip beside h2o; layer 0 keeps all
    heads = heads_with(L, H, costs, budgets, context_len=300)
    pooled = PrefillCells("kvzip", budgets, *heads.prefill_cells[1].arrays, {"allocation": "model"})
    heads = type(heads)(heads.retrieval, heads.provenance, None, (heads.prefill_cells[0], pooled))
    return get_solver(method, granularity="head").solve(Problem(global_budget=111, table=table_of(heads), b_min=8))


def test_head_solvers_give_pooled_heads_a_group_each_and_the_strategy_scores_alike_on_both_engines():
    for method in ("ilp", "dp"):
        result = pooled_solve(method)
        assert "(h2o,kvzip[allocation=model] cells): 2 keep all 300 tokens;" in result.message  # the spec, not its name
        assert "kvzip[allocation=model]@16 3, h2o@16 1 of 6" in result.message
        s = result.strategy
        labels = [[g.label() for g in s.head_groups(layer, "prefill")] for layer in range(3)]
        pooled = "kvzip[allocation=model]@16"  # the label names the pool: per-head kvzip is another pattern
        assert labels == [["full@300[0,1]"], [f"{pooled}[0]", f"{pooled}[1]"], [f"{pooled}[0]", "h2o@16[1]"]]
        assert s.head_groups(1, "decoding")[1].params == {"allocation": "model"}
        assert Strategy.from_json(s.to_json()).to_json() == s.to_json()
    assert_engines_agree(s)


def test_show_names_the_pool_of_a_head_group(tmp_path, capsys):
    from polykv_search.cli import main

    path = tmp_path / "s.json"
    pooled_solve("ilp").strategy.save(path)
    assert main(["show", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "kvzip[allocation=model]@16[0]" in printed and "h2o@16[1]" in printed  # rich markup escaped


def test_collect_measures_pooled_kvzip_head_cells_and_the_solve_pools_the_heads(tmp_path, capsys):
    from test_collect_cli import run_cli

    from signals import SignalTable
    from tests.test_head_patterns import collect_argv

    argv, out = collect_argv(tmp_path), tmp_path / "signals.json"
    spec = ["--head-patterns", "h2o,kvzip[allocation=model]", "--out", str(out)]
    assert run_cli([*argv, *spec]) == 0
    assert "kvzip prefill cells: budgets 16,32" in " ".join(capsys.readouterr().err.split())
    heads = SignalTable.load(out).heads
    assert [(c.pattern, c.params) for c in heads.prefill_cells] == [("h2o", {}), ("kvzip", {"allocation": "model"})]
    assert (heads.prefill_cells[1].kl_answer_mean >= 0).all() and heads.prefill_cells[1].provenance["seconds"] > 0
    assert run_cli([*argv, *spec]) == 0  # measured already: nothing again
    assert "cells: budgets" not in capsys.readouterr().err and SignalTable.load(out).heads == heads
    assert run_cli(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "head cells: h2o, kvzip[allocation=model] on" in shown and "kvzip[allocation=model] (prefill)" in shown
    solver = get_solver("ilp", granularity="head", head_patterns="kvzip")
    s = solver.solve(Problem(global_budget=40, table=SignalTable.load(out), b_min=8)).strategy
    groups = [g for layer in range(2) for g in s.head_groups(layer, "prefill")]
    pooled = [g for g in groups if g.pattern == "kvzip"]
    assert pooled and all(len(g.heads) == 1 and g.params == {"allocation": "model"} for g in pooled)
    for bad, message in [
        ("kvzip[allocation=global]", "allocation must be one of head, layer, model, got 'global'"),
        ("kvzip,kvzip[allocation=model]", "one spec per pattern"),
    ]:
        assert run_cli([*argv, "--head-patterns", bad, "--out", str(tmp_path / "bad.json")]) == 2
        err = capsys.readouterr().err
        assert message in " ".join(err.split()) and not (tmp_path / "bad.json").exists()
