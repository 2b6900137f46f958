"""Pattern specs (``kvzip[allocation=model]``): a pattern with parameters is a grid column of `collect` and a
candidate of the solvers, and the strategies they write carry the parameters to the runtime."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from polykv_search.cli import main
from polykv_search.cli.arg_types import comma_list
from polykv_search.patterns import canonical_spec, make_spec, pattern_spec, split_specs
from polykv_search.runtime import apply_strategy
from signals import random_signal_table
from signals.collect import CollectError, collect_signals, make_settings
from solvers import Problem, SolverError, get_solver
from strategies import Strategy
from tests.oracle import Oracle
from tests.test_collect import assert_tables_close, make_samples
from tests.test_kvzip_pooled import held, oracle_held
from tests.test_runtime import batch
from tests.tiny import tiny_model

MODEL = "kvzip[allocation=model]"


def test_a_spec_is_a_name_with_the_parameters_that_differ_from_the_defaults():
    assert pattern_spec(MODEL) == ("kvzip", {"allocation": "model"})
    assert pattern_spec("snapkv[window=16, kernel=7]") == ("snapkv", {"window": 16, "kernel": 7})
    assert canonical_spec("kvzip[allocation=head]") == "kvzip" == canonical_spec("kvzip[]")
    assert canonical_spec("kvzip[allocation=model,n_sink=4]") == MODEL  # n_sink=4 is the default
    assert make_spec(MODEL).pooled == "model" and make_spec("kvzip").pooled is None
    assert split_specs("snapkv, kvzip[allocation=model,n_sink=2],tova") == [
        "snapkv",
        "kvzip[allocation=model,n_sink=2]",
        "tova",
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("kvzip[allocation=pool]", "allocation must be one of head, layer, model, got 'pool'"),
        ("kvzip[budget=3]", "unexpected keyword argument 'budget'"),
        ("kvzip[allocation]", "KEY=VALUE, got 'allocation'"),
        ("kvzip[allocation=model", "NAME or NAME[KEY=VALUE,...]"),
        ("zip", "unknown pattern 'zip'"),
    ],
)
def test_a_bad_spec_is_refused_in_one_line_naming_it(spec, message):
    with pytest.raises(ValueError) as err:
        pattern_spec(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_collect_names_its_columns_canonically_and_refuses_duplicates_and_bad_specs():
    kw = dict(budgets=[8], phases=["prefill"], layers=None, naive=False, batch_tokens=64)
    s = make_settings(2, patterns=["snapkv", "kvzip[allocation=head]", MODEL], **kw)
    assert s.patterns == ("snapkv", "kvzip", MODEL)
    with pytest.raises(CollectError, match="duplicates"):
        make_settings(2, patterns=["kvzip", "kvzip[allocation=head]"], **kw)
    with pytest.raises(CollectError, match="patterns: pattern 'kvzip\\[allocation=x\\]': allocation must be one of"):
        make_settings(2, patterns=["kvzip[allocation=x]"], **kw)


def test_the_command_line_splits_pattern_lists_outside_brackets():
    parse = comma_list(str, "pattern", split=split_specs)
    assert parse("snapkv,kvzip[allocation=model,n_sink=2]") == ["snapkv", "kvzip[allocation=model,n_sink=2]"]
    with pytest.raises(argparse.ArgumentTypeError, match="empty pattern"):
        parse("snapkv,,tova")


def test_a_pooled_cell_is_layer_l_alone_pooling_its_own_heads_and_replay_equals_the_naive_forward():
    """A cell evicts in layer l only, so a pooled allocation pools layer l's KV heads (``model`` and ``layer``
    give the same cell); that is what the runtime does with the cell's single-layer strategy (the naive path)."""
    torch.set_num_threads(1)
    model = tiny_model("llama", layers=3)
    samples = make_samples(2, n=28, m=4)
    patterns = ["kvzip", "kvzip[allocation=layer]", MODEL]
    kw = dict(patterns=patterns, budgets=[6, 20], layers=[0, 2], journal=False)
    fast = collect_signals(model, samples, **kw)
    assert_tables_close(fast, collect_signals(model, samples, naive=True, **kw))
    assert fast.patterns == tuple(patterns)
    assert fast.provenance["patterns"][MODEL]["allocation"] == "model"
    kl = fast.kl_array()[[0, 2]]  # [layers, phases, patterns, budgets]
    np.testing.assert_array_equal(kl[:, :, 1], kl[:, :, 2])
    assert not np.allclose(kl[:, :, 0], kl[:, :, 2]), "pooling the heads should change some cell"


def table_with_a_spec_column():
    return random_signal_table(4, patterns=("snapkv", "tova", MODEL), budgets=(8, 12, 16), seed=3)


def test_solvers_write_a_spec_as_its_pattern_and_parameters():
    table = table_with_a_spec_column()
    problem = Problem(global_budget=12, num_layers=4, b_min=8, table=table)
    strategy = get_solver("ilp").solve(problem).strategy
    chosen = [c for phase in ("prefill", "decoding") for c in strategy.phase(phase)]
    assert {(c.pattern, dict(c.params).get("allocation")) for c in chosen} == {
        ("snapkv", None),
        ("tova", None),
        ("kvzip", "model"),
    }, "the seed should make ilp mix the three columns"
    assert all(dict(c.params) == {"allocation": "model"} for c in chosen if c.pattern == "kvzip")
    labels = {c.label().split("@")[0] for c in chosen}
    assert labels == {"snapkv", "tova", MODEL}, "a choice is labelled by its spec"
    fixed = Problem(global_budget=12, num_layers=4, b_min=8, table=table, fixed_pattern="kvzip[allocation=model]")
    strategy = get_solver("proportional").solve(fixed).strategy
    assert {(c.pattern, c.params["allocation"]) for c in strategy.phase("prefill")} == {("kvzip", "model")}
    with pytest.raises(SolverError, match="patterns: 'kvzip' is not in the signal table"):
        Problem(global_budget=12, num_layers=4, table=table, patterns=["kvzip[allocation=head]"])


def test_a_solved_mix_pools_its_kvzip_layers_together_at_run_time(tmp_path):
    """The layers that chose ``kvzip[allocation=model]`` form one pool (the oracle's rule); the others keep b."""
    table = random_signal_table(3, patterns=("snapkv", MODEL), budgets=(8, 12, 16), seed=0)
    problem = Problem(global_budget=12, num_layers=3, b_min=8, table=table, phases=("prefill",))
    strategy = Strategy.load(get_solver("ilp").solve(problem).strategy.save(tmp_path / "s.json"))
    zipped = [i for i, c in enumerate(strategy.phase("prefill")) if c.pattern == "kvzip"]
    assert 2 <= len(zipped) < 3, "the seed should give a pool of two layers beside a snapkv layer"
    model = tiny_model("llama", layers=3, seed=8)
    ids, mask = batch(seed=9, n=28, pad=4)
    with torch.no_grad(), apply_strategy(model, strategy) as rt:
        model(ids, attention_mask=mask, use_cache=True)
        got = held(rt.last_cache)
    with torch.no_grad(), Oracle(model, strategy) as oracle:
        model(ids, attention_mask=mask, use_cache=True)
    assert got == oracle_held(oracle, rt.last_cache)
    budgets = strategy.budgets("prefill")
    for b in range(2):
        assert sum(len(got[l, b, h]) for l in zipped for h in range(2)) == 2 * sum(budgets[l] for l in zipped)


def test_solve_takes_spec_patterns_on_the_command_line(tmp_path, capsys):
    signals = table_with_a_spec_column().save(tmp_path / "signals.json")
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "ilp", "--signals", str(signals), "--budget", "12", "--b-min", "8"]
    assert main([*argv, "--patterns", f"tova,{MODEL}", "--out", str(out)]) == 0
    solved = Strategy.load(out)
    assert {c.pattern for c in solved.phase("prefill")} <= {"tova", "kvzip"}
    pooled = {p: sum(c.pattern == "kvzip" for c in solved.phase(p)) for p in ("prefill", "decoding")}
    note = " ".join(capsys.readouterr().err.split())
    assert f"note: {pooled['prefill']} prefill and {pooled['decoding']} decoding layers use allocation='model'" in note
    assert main(["show", str(out)]) == 0
    assert MODEL in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    assert main([*argv, "--patterns", "tova,kvzip[allocation=pool]", "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "allocation must be one of head, layer, model, got 'pool'" in err and "Traceback" not in err
    assert not bad.exists()


def test_a_uniform_baseline_takes_a_spec_or_colon_parameters_and_names_the_entry_canonically():
    from polykv_search.cli.baselines import baseline
    from polykv_search.scoring import ScoreError

    for spec in ("uniform:kvzip[allocation=model]", "uniform:kvzip:allocation=model"):
        entry = baseline(spec, 3, 64)
        assert entry.name == "uniform-kvzip[allocation=model]"
        assert {(c.pattern, c.budget, c.params["allocation"]) for c in entry.strategy.phase("prefill")} == {
            ("kvzip", 64, "model")
        }
    assert baseline("uniform:kvzip[allocation=head]", 3, 64).name == "uniform-kvzip"
    assert (
        baseline("uniform:kvzip[allocation=model]:n_sink=2", 3, 64).name == "uniform-kvzip[allocation=model,n_sink=2]"
    )
    for bad, message in (("uniform:kvzip[allocation=x]", "got 'x'"), ("uniform:kvzip:allocation", "KEY=VALUE")):
        with pytest.raises(ScoreError, match=message):
            baseline(bad, 3, 64)


def test_terminal_output_prints_spec_names_whole_not_as_rich_markup(tmp_path, capsys):
    """``[allocation=model]`` looks like a rich markup tag; printed through markup it would vanish."""
    out = tmp_path / "u.json"
    assert main(["solve", "--method", "uniform", "--pattern", MODEL, "--budget", "64", "--out", str(out)]) == 0
    assert f"{MODEL} at 64 tokens in every layer" in capsys.readouterr().err
    results = "studies/kvzip/h18b-aware-B256.json.xz"  # a committed run with a uniform-kvzip[allocation=model] entry
    assert main(["compare", results]) == 0
    assert f"best uniform at B=256: ruler uniform-{MODEL}" in " ".join(capsys.readouterr().err.split())


def test_a_prediction_reads_the_column_of_the_choices_spec():
    """``kvzip`` with ``allocation="model"`` is predicted from the ``kvzip[allocation=model]`` cells, never from
    per-head ``kvzip``'s; a choice whose parameters have no column gets no prediction."""
    from signals.predict import cell_costs, predict_degradation
    from solvers.problem import layer_choice
    from strategies import LayerChoice

    table = random_signal_table(3, patterns=("snapkv", "kvzip", MODEL), budgets=(8, 16), seed=0)
    costs = cell_costs(table, "kl", "none")
    for spec, column in (("kvzip", 1), (MODEL, 2)):
        uniform = Strategy([layer_choice(spec, 8)] * 3, [layer_choice(spec, 8)] * 3, 8, 1)
        want = costs[:, :, column, 0].sum()
        assert predict_degradation(table, uniform, ("prefill", "decoding"), "kl") == pytest.approx(want)
    odd = Strategy([LayerChoice("snapkv", 8, {"window": 4})] * 3, [LayerChoice("snapkv", 8)] * 3, 8, 1)
    assert predict_degradation(table, odd, ("prefill", "decoding"), "kl") is None
