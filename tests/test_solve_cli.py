"""`polykv-search solve`: a strategy file per run, the ablation switches, one-line errors with exit 2."""

from __future__ import annotations

import pytest

from polykv_search.cli import main
from signals import random_signal_table
from strategies import Strategy

PATTERNS = ("snapkv", "tova", "h2o", "streaming_llm")


@pytest.fixture
def signals(tmp_path):
    table = random_signal_table(6, budgets=(32, 64, 128), seed=1, patterns=PATTERNS)
    return table.save(tmp_path / "signals.json")


def solve(tmp_path, *argv):
    out = tmp_path / "s.json"
    rc = main(["solve", *map(str, argv), "--out", str(out)])
    return rc, out


def test_solve_writes_a_valid_strategy_with_its_provenance(tmp_path, signals):
    rc, out = solve(tmp_path, "--method", "proportional", "--signals", signals, "--budget", 64, "--b-min", 16)
    assert rc == 0
    s = Strategy.load(out)
    assert s.num_layers == 6 and s.global_budget == 64 and s.b_min == 16
    assert sum(s.budgets("prefill")) == sum(s.budgets("decoding")) == 6 * 64
    assert s.provenance["solver"] == "proportional"
    assert s.provenance["ablation"] == {"uniform_budgets": False, "fixed_pattern": None}
    assert set(s.provenance["predicted"]) == {"dppl", "1-cosine", "kl"}


def test_uniform_budgets_flag_gives_patterns_only(tmp_path, signals):
    rc, out = solve(tmp_path, "--method", "ilp", "--signals", signals, "--budget", 64, "--uniform-budgets")
    assert rc == 0
    s = Strategy.load(out)
    assert s.budgets("prefill") == s.budgets("decoding") == [64] * 6
    assert s.provenance["ablation"]["uniform_budgets"] is True


def test_fixed_pattern_flag_gives_budgets_only(tmp_path, signals):
    rc, out = solve(
        tmp_path, "--method", "proportional", "--signals", signals, "--budget", 64, "--fixed-pattern", "h2o"
    )
    assert rc == 0
    s = Strategy.load(out)
    assert set(s.patterns("prefill")) == set(s.patterns("decoding")) == {"h2o"}
    assert len(set(s.budgets("prefill"))) > 1  # budgets still vary per layer


def test_phases_flag_leaves_the_other_phase_uniform(tmp_path, signals):
    rc, out = solve(tmp_path, "--method", "ilp", "--signals", signals, "--budget", 64, "--phases", "prefill")
    assert rc == 0
    s = Strategy.load(out)
    assert s.provenance["phases_optimized"] == ["prefill"]
    assert [(c.pattern, c.budget) for c in s.phase("decoding")] == [("snapkv", 64)] * 6


def test_default_pattern_flag_sets_the_phase_not_optimized(tmp_path, signals):
    rc, out = solve(
        tmp_path,
        "--method",
        "ilp",
        "--signals",
        signals,
        "--budget",
        64,
        "--phases",
        "decoding",
        "--default-pattern",
        "tova",
    )
    assert rc == 0
    assert [(c.pattern, c.budget) for c in Strategy.load(out).phase("prefill")] == [("tova", 64)] * 6


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "proportional", "--budget", 64], "needs --signals"),
        (["--method", "nope", "--budget", 64], "nope"),
        (["--method", "proportional", "--budget", 64, "--fixed-pattern", "knorm"], "fixed_pattern"),
        (["--method", "proportional", "--budget", 1000, "--b-min", 2000], "b_min"),
        (["--method", "uniform", "--budget", 64, "--num-layers", 6, "--beta", 3], "--beta"),
    ],
)
def test_bad_input_is_one_line_with_exit_2_and_writes_nothing(tmp_path, signals, capsys, argv, message):
    if "proportional" in argv and "needs --signals" != message:
        argv = [*argv, "--signals", signals]
    rc, out = solve(tmp_path, *argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_list_methods_names_every_solver(capsys):
    assert main(["solve", "--list-methods"]) == 0
    text = capsys.readouterr().out
    for name in ("proportional", "ilp", "dp", "optuna", "uniform", "pyramid", "squeeze", "cake"):
        assert name in text


def test_solve_reports_the_unused_budget_and_takes_the_new_settings(tmp_path, signals, capsys):
    rc, out = solve(
        tmp_path,
        "--method",
        "dp",
        "--signals",
        signals,
        "--budget",
        64,
        "--objective",
        "kl",
        "--noise",
        "clip",
        "--tie-break",
        "save",
    )
    assert rc == 0
    s = Strategy.load(out)
    unused = s.provenance["unused_budget"]
    assert s.provenance["budget_total"] == 6 * 64 and unused["prefill"] == 6 * 64 - sum(s.budgets("prefill"))
    assert s.provenance["objective_cost"] == {
        "objective": "kl",
        "noise": "clip",
        "confidence": 0.95,
        "tie_break": "save",
        "tie_tolerance": 0.0,
    }
    err = " ".join(capsys.readouterr().err.split())
    assert f"unused budget (of 384 tokens per phase): prefill {unused['prefill']}" in err
    assert "optimal kl (noise=clip)" in err


def test_a_table_with_a_nan_cell_is_refused_naming_the_cell(tmp_path, capsys):
    import json

    doc = random_signal_table(6, budgets=(32, 64, 128), seed=1, patterns=PATTERNS).to_json()
    doc["dppl"][2][1][0][1] = float("nan")  # json writes the NaN literal
    bad = tmp_path / "nan.json"
    bad.write_text(json.dumps(doc))
    for method in ("proportional", "ilp"):
        rc, out = solve(tmp_path, "--method", method, "--signals", bad, "--budget", 64)
        err = capsys.readouterr().err
        assert rc == 2 and "dppl[2][1][0][1]: not a finite number" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1 and not out.exists()
