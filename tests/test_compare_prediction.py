"""Predicted vs measured: Spearman's ρ between a signal table's predicted degradation and the measured
scores and KL, per budget, with a seeded bootstrap interval over the entries (`compare --signals`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polykv_search import compare as cmp
from polykv_search.cli import main
from polykv_search.compare.prediction import MIN_ENTRIES, describe, prediction_agreement, spearman_interval
from signals.synthetic import random_signal_table

V2 = Path(__file__).parent / "fixtures" / "results_v2.json"
PATTERNS = ("snapkv", "pyramidkv", "streaming_llm", "tova", "h2o")


def test_a_monotone_relation_has_rho_one_and_a_point_interval():
    assert spearman_interval([1, 2, 3, 4, 5], [10, 20, 25, 40, 90], resamples=999) == pytest.approx((1.0, 1.0, 1.0))
    assert spearman_interval([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], resamples=999) == pytest.approx((-1.0, -1.0, -1.0))


def test_the_interval_is_seeded_and_covers_the_estimate():
    x, y = [0.1, 0.4, 0.2, 0.9, 0.5, 0.7, 0.3, 0.8], [3, 2, 5, 1, 4, 0, 6, 2]
    a = spearman_interval(x, y, seed=3, resamples=999)
    assert a == spearman_interval(x, y, seed=3, resamples=999)
    assert a != spearman_interval(x, y, seed=4, resamples=999)
    rho, low, high = a
    assert -1 <= low <= rho <= high <= 1 and low < high


def test_too_few_or_constant_values_give_no_rho():
    assert spearman_interval([1, 2, 3][: MIN_ENTRIES - 1], [3, 2, 1][: MIN_ENTRIES - 1]) == (None, None, None)
    assert spearman_interval([1, 1, 1, 1], [1, 2, 3, 4]) == (None, None, None)
    with pytest.raises(ValueError, match="predictions"):
        spearman_interval([1, 2, 3, 4], [1, 2, 3])


def test_predictions_that_rank_like_the_scores_agree_and_full_kv_is_left_out():
    comparison = cmp.compare([cmp.load_results(V2)], sources=[str(V2)])
    by_strategy = {json.dumps(r.strategy, sort_keys=True): r for r in comparison.rows}

    def predict(strategy):  # minus the broad score: a perfect predictor of broad, by construction
        return -by_strategy[json.dumps(strategy, sort_keys=True)].suites["broad"]

    agreement = {a.measure: a for a in prediction_agreement(comparison, predict, resamples=499)}
    assert set(agreement) == {"broad", "ruler", "kl:broad"}
    broad = agreement["broad"]
    assert broad.rho == pytest.approx(-1.0) and broad.agrees and broad.expected_sign == -1
    assert "full" not in broad.entries and len(broad.entries) == len(comparison.rows) - 1
    assert agreement["kl:broad"].expected_sign == 1
    assert describe(broad).startswith("B=64 broad: ρ = -1.00") and "agrees" in describe(broad)


def test_compare_signals_prints_and_writes_the_rank_agreement(tmp_path, capsys):
    table = random_signal_table(4, patterns=PATTERNS, budgets=(16, 32, 64, 128), seed=1)
    table.save(tmp_path / "signals.json")
    out = tmp_path / "cmp.json"
    argv = ["compare", str(V2), "--signals", str(tmp_path / "signals.json"), "--json", str(out), "--resamples", "499"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "predicted kl degradation vs measured" in printed and "B=64 broad: ρ =" in printed
    doc = json.loads(out.read_text())["prediction"]
    assert doc["objective"] == "kl" and {a["measure"] for a in doc["agreement"]} == {"broad", "ruler", "kl:broad"}
    for a in doc["agreement"]:
        assert a["n"] >= MIN_ENTRIES and -1 <= a["spearman"] <= 1 and "full" not in a["entries"]


def test_compare_signals_with_a_missing_table_is_a_one_line_error(tmp_path, capsys):
    assert main(["compare", str(V2), "--signals", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nope.json" in err and len(err.splitlines()) == 1 and "Traceback" not in err
