"""The uniform guard: whole strategies measured end to end, and the solved strategy kept unless a
uniform's KL is resolved below it."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
from test_retrieval_calibration import one_thread  # noqa: F401  (autouse: one intra-op thread)
from test_retrieval_calibration_cli import checkpoint, cli_argv  # noqa: F401  (module fixture)
from tiny import tiny_model

from signals.naive import NaiveReference, naive_cell, single_layer_strategy
from signals.strategy_kl import strategies_kl
from solvers import Problem
from solvers.guard import decide, offered_patterns, uniform_candidates
from strategies import LayerChoice, Strategy


# ------------------------------------------------------------------------------ decision
def test_a_uniform_resolved_lower_replaces_the_solved_strategy():
    rng = np.random.default_rng(0)
    solved = 0.5 + rng.normal(0, 0.05, 24)
    kl = np.stack([solved, solved - 0.2 + rng.normal(0, 0.01, 24), solved - 0.1 + rng.normal(0, 0.01, 24)], 1)
    g = decide(kl, ["ilp", "uniform-a", "uniform-b"], ["prose"] * 24)
    assert g.replaced and g.chosen == "uniform-a"  # both resolved lower; the lower mean wins
    assert g.versus["uniform-a"].high < 0 and g.versus["uniform-b"].high < 0
    assert g.test_level == pytest.approx(1 - 0.05 / 2)


def test_a_difference_inside_its_interval_keeps_the_solved_strategy():
    rng = np.random.default_rng(1)
    solved = 0.5 + rng.normal(0, 0.05, 12)
    kl = np.stack([solved, solved - 0.01 + rng.normal(0, 0.2, 12)], 1)
    g = decide(kl, ["ilp", "uniform-a"], ["prose"] * 12)
    assert g.means["uniform-a"].estimate < g.means["ilp"].estimate  # lower on average ...
    assert not g.versus["uniform-a"].excludes_zero and g.chosen == "ilp" and not g.replaced  # ... not resolved


def test_more_uniforms_test_at_a_stricter_level():
    rng = np.random.default_rng(3)
    solved = rng.normal(0.5, 0.05, 10)
    noisy = solved - 0.05 + rng.normal(0, 0.06, 10)
    alone = decide(np.stack([solved, noisy], 1), ["ilp", "uniform-a"], ["prose"] * 10)
    many = decide(
        np.stack([solved, noisy] + [solved + 1.0] * 19, 1),
        ["ilp", *[f"uniform-{i}" for i in range(20)]],
        ["prose"] * 10,
    )
    assert alone.test_level == pytest.approx(0.95) and many.test_level == pytest.approx(1 - 0.05 / 20)
    assert alone.versus["uniform-a"].high < 0 and alone.replaced
    assert many.versus["uniform-0"].high > alone.versus["uniform-a"].high  # a wider interval at the stricter level


def test_each_kind_of_sample_weighs_the_same_whatever_the_mix():
    kinds = ["prose"] * 9 + ["evidence"] * 3
    solved = np.array([0.1] * 9 + [2.0] * 3)
    uniform = np.array([0.15] * 9 + [0.2] * 3)  # slightly worse on prose, keeps the evidence
    g = decide(np.stack([solved, uniform], 1), ["ilp", "uniform-kvzip"], kinds)
    assert g.means["ilp"].estimate == pytest.approx((0.1 + 2.0) / 2)
    assert g.means["uniform-kvzip"].estimate == pytest.approx((0.15 + 0.2) / 2)
    assert g.versus["uniform-kvzip"].estimate == pytest.approx(((0.15 - 0.1) + (0.2 - 2.0)) / 2)


def test_decide_refuses_a_matrix_that_does_not_fit_its_names():
    from solvers.base import SolverError

    with pytest.raises(SolverError, match="guard"):
        decide(np.zeros((3, 2)), ["ilp", "uniform-a", "uniform-b"], ["prose"] * 3)


# ------------------------------------------------------------------------------ candidates
def test_the_candidates_are_the_uniform_solver_strategies_less_the_solved_one():
    problem = Problem(global_budget=20.7, num_layers=3, patterns=["snapkv", "tova", "kvzip[allocation=model]"])
    solved = Strategy([LayerChoice("tova", 20)] * 3, [LayerChoice("tova", 20)] * 3, 20.7, 1)
    cands = uniform_candidates(problem, solved)
    assert [n for n, _ in cands] == ["uniform-snapkv", "uniform-kvzip[allocation=model]"]
    pooled = cands[1][1]
    assert all(c == LayerChoice("kvzip", 20, {"allocation": "model"}) for c in pooled.prefill)


def test_a_head_level_solve_offers_the_uniforms_of_its_head_patterns_too():
    """The table's layer patterns are snapkv only; the head-level solve gives heads to KVzip's pool and h2o, so
    those uniforms are candidates too (once each, parameters at their defaults not told apart)."""
    from strategies.head_groups import HeadGroup

    problem = Problem(global_budget=16, num_layers=2, patterns=["snapkv"], phases=("prefill",))
    groups = (
        HeadGroup((0,), "full", 32),
        HeadGroup((1,), "kvzip", 8, {"allocation": "model"}),
        HeadGroup((2,), "h2o", 12),
        HeadGroup((3,), "snapkv", 12, {}),
    )
    layer = LayerChoice.grouped(groups)
    solved = Strategy([layer, layer], [LayerChoice("snapkv", 16)] * 2, 16, 1, context_len=32, num_kv_heads=4)
    assert offered_patterns(problem, solved) == ["snapkv", "kvzip[allocation=model]", "h2o"]
    names = [n for n, _ in uniform_candidates(problem, solved)]
    assert names == ["uniform-snapkv", "uniform-kvzip[allocation=model]", "uniform-h2o"]
    layer_level = Strategy([LayerChoice("snapkv", 16)] * 2, [LayerChoice("snapkv", 16)] * 2, 16, 1)
    assert offered_patterns(problem, layer_level) == ["snapkv"]


# ------------------------------------------------------------------------------ measurement
@pytest.fixture(scope="module")
def model_and_samples():
    model = tiny_model("llama", layers=2, seed=4)
    g = torch.Generator().manual_seed(5)
    samples = [
        types.SimpleNamespace(
            context_ids=torch.randint(4, 128, (96,), generator=g).tolist(),
            continuation_ids=torch.randint(4, 128, (12,), generator=g).tolist(),
            scored=scored,
        )
        for scored in (None, (3, 9))
    ]
    return model, samples


def test_fullkv_measures_zero_and_an_eviction_measures_more(model_and_samples):
    model, samples = model_and_samples
    full, snap = Strategy.full(2), Strategy([LayerChoice("snapkv", 16)] * 2, [LayerChoice("snapkv", 16)] * 2, 16, 1)
    kl = strategies_kl(model, samples, [full, snap])
    assert kl.shape == (2, 2)
    assert np.all(np.abs(kl[:, 0]) < 1e-6) and np.all(kl[:, 1] > 1e-4)


@pytest.mark.parametrize("phase", ["prefill", "decoding"])
def test_a_one_layer_strategy_measures_what_the_naive_cell_measures(model_and_samples, phase):
    """The cell's definition (signals.naive) on the scored span is the reference of the whole-strategy KL."""
    model, samples = model_and_samples
    strategy = single_layer_strategy(2, 1, phase, "tova", 24)
    kl = strategies_kl(model, samples, [strategy])
    for i, s in enumerate(samples):
        ref = NaiveReference(model, s.context_ids, s.continuation_ids)
        _, _, cell = naive_cell(model, ref, s.context_ids, s.continuation_ids, 1, phase, "tova", 24)
        a, b = s.scored or (0, len(s.continuation_ids))
        assert kl[i, 0] == pytest.approx(float(cell[a:b].mean()), rel=1e-4, abs=1e-7)


# ------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def table_path(checkpoint, tmp_path_factory):  # noqa: F811
    from polykv_search.cli import main

    ckpt, corpus = checkpoint
    out = tmp_path_factory.mktemp("guard") / "table.json"
    argv = cli_argv(ckpt, corpus, out, "--retrieval-mix", "1", "--evidence-records", "3")
    argv[argv.index("--patterns") + 1] = "snapkv,tova,streaming_llm"
    argv[argv.index("--budgets") + 1] = "16,32"
    argv[argv.index("--layers") + 1] = "all"
    assert main(argv) == 0
    return ckpt, out


def test_solve_with_the_guard_writes_the_strategy_it_chose(table_path, tmp_path, capsys):
    from polykv_search.cli import main

    ckpt, table = table_path
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "ilp", "--signals", str(table), "--budget", "24", "--model", str(ckpt)]
    assert main([*argv, "--guard", "4", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    text = " ".join(captured.out.split())
    assert "warning: 2 evidence, 2 prose samples; bootstrap intervals from fewer than 8" in " ".join(
        captured.err.split()
    )
    assert "uniform guard: KL to FullKV on 4 calibration samples (2 evidence, 2 prose)" in text
    saved = json.loads(out.read_text())
    guard = saved["provenance"]["guard"]
    assert guard["solved"] == "ilp" and set(guard["per_sample"]) == {
        "ilp",
        "uniform-snapkv",
        "uniform-tova",
        "uniform-streaming_llm",
    }
    assert guard["samples"]["seed"] == 1 and guard["samples"]["mix"] == "0.5" and guard["kinds"].count("evidence") == 2
    if guard["replaced"]:
        pattern = guard["chosen"].removeprefix("uniform-")
        assert {row["prefill"]["pattern"] for row in saved["layers"]} == {pattern} and "replaces ilp" in text
    else:
        assert saved["provenance"]["solver"] == "ilp" and "guard: ilp stays" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--guard-seed", "3"], "--guard-seed and --guard-mix apply with --guard N"),
        (["--guard", "1"], "--guard 1: needs at least 2 samples"),
        (["--guard", "4", "--guard-mix", "1.5"], "--guard-mix: retrieval mix '1.5'"),
        (["--guard", "4", "--method", "optuna"], "--guard does not apply to optuna"),
    ],
)
def test_bad_guard_flags_are_one_line_errors(table_path, tmp_path, capsys, extra, message):
    from polykv_search.cli import main

    _, table = table_path
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "ilp", "--signals", str(table), "--budget", "24", "--out", str(out)]
    if "optuna" in extra:
        argv[argv.index("ilp")] = "optuna"
        extra = extra[:2]
    assert main([*argv, *extra]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_a_guard_without_evidence_samples_says_it_cannot_see_evidence(table_path, tmp_path, capsys):
    from polykv_search.cli import main

    ckpt, table = table_path
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "ilp", "--signals", str(table), "--budget", "24", "--model", str(ckpt)]
    assert main([*argv, "--guard", "3", "--guard-mix", "0", "--out", str(out)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "no guard sample carries evidence" in err and "warning: 3 prose samples" in err
    assert json.loads(out.read_text())["provenance"]["guard"]["kinds"] == ["prose"] * 3


def test_the_guard_needs_a_table(tmp_path, capsys):
    from polykv_search.cli import main

    out = tmp_path / "s.json"
    argv = ["solve", "--method", "uniform", "--num-layers", "2", "--budget", "24", "--guard", "4", "--out", str(out)]
    assert main(argv) == 2
    assert "--guard needs --signals" in capsys.readouterr().err and not out.exists()
