"""Scoring: every entry runs the same samples through the same runtime; baselines by spec."""

from __future__ import annotations

import pytest

from polykv_search import scoring
from polykv_search.cli.baselines import baseline
from strategies import Strategy
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.tiny import tiny_model


def test_baseline_specs_build_the_named_strategies():
    assert baseline("full", 4, None).strategy.is_full
    u = baseline("uniform:tova", 4, 32).strategy
    assert u.patterns("prefill") == ["tova"] * 4 and u.budgets("decoding") == [32] * 4
    p = baseline("pyramid", 4, 32).strategy
    assert sum(p.budgets("prefill")) == 128 and p.budgets("prefill")[0] > p.budgets("prefill")[-1]


@pytest.mark.parametrize(
    "spec, budget, message",
    [("uniform:snapkv", None, "needs --budget"), ("uniform", 32, "needs a pattern"), ("bogus", 32, "unknown baseline")],
)
def test_bad_baselines_are_clear_errors(spec, budget, message):
    with pytest.raises(scoring.ScoreError, match=message):
        baseline(spec, 4, budget)


def test_entries_share_samples_and_record_scores_and_kv_bytes():
    model, tok = tiny_model("llama", vocab_size=128), char_tokenizer()
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=400, seed=0)
    full = scoring.score_entry(model, tok, scoring.Entry("full", Strategy.full(3), "baseline", "full"), samples)
    again = scoring.score_entry(model, tok, scoring.Entry("full", Strategy.full(3), "baseline", "full"), samples)
    small = scoring.score_entry(model, tok, baseline("uniform:snapkv", 3, 16), samples)
    assert full["scores"] == again["scores"]  # deterministic
    for rec in (full, small):
        assert set(rec["scores"]) == {"broad/continuation", "ruler/niah_single"}
        assert all(0 <= v <= 100 for v in rec["scores"].values())
    assert full["kv_ratio"] == pytest.approx(1.0)
    assert small["kv_bytes"] < 0.2 * small["full_kv_bytes"]
    # teacher-forced continuation after a compressed context changes the predictions
    assert full["extra"]["broad/continuation"] != small["extra"]["broad/continuation"]


def test_unknown_task_is_a_clear_error():
    with pytest.raises(scoring.ScoreError):
        scoring.resolve_tasks("ruler/nope")
