"""End to end on the real default model (slow): the suite separates FullKV from a broken cache."""

from __future__ import annotations

import warnings

import pytest

from polykv_search.evaluation import get_task, run_task


@pytest.mark.slow
def test_fullkv_finds_the_passkey_at_512_tokens_and_random_budget_4_scores_lower():
    from polykv_search.data import load_corpus
    from polykv_search.models import load_model
    from polykv_search.runtime import apply_strategy
    from strategies import Strategy

    model, tok = load_model()
    with warnings.catch_warnings():  # without apt the corpus falls back to pydoc text, with a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        texts = [d.text for d in load_corpus("austen").documents]
    task = get_task("ruler/niah_single")
    samples = task.generate(tok, texts, 3, 512, seed=0)
    assert all(505 <= s.meta["prompt_tokens"] <= 512 for s in samples)

    full = run_task(model, tok, task, samples, max_new_tokens=12)
    assert full.score == 100.0, full.predictions

    broken = Strategy.uniform(model.config.num_hidden_layers, "random", 4)
    destroyed = run_task(model, tok, task, samples, runner=lambda: apply_strategy(model, broken), max_new_tokens=12)
    assert destroyed.score < full.score, destroyed.predictions
