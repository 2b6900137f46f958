"""`benchmarks/diagnose_additivity.py`: the prediction is the sum of a pattern's single-layer cells,
and the measurement evicts every layer (nothing at all when the budget holds the whole sample)."""

from __future__ import annotations

import numpy as np

from polykv_search.data import Sample
from strategies import Strategy
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.tiny import tiny_model

L = 3


def samples(n: int = 2, ctx: int = 80, cont: int = 10) -> list[Sample]:
    ids = char_tokenizer()(haystack_texts()[2], add_special_tokens=False)["input_ids"]
    step = ctx + cont
    cut = [(ids[i * step : i * step + ctx], ids[i * step + ctx : (i + 1) * step]) for i in range(n)]
    return [Sample(c, t, "d", i * step) for i, (c, t) in enumerate(cut)]


def test_the_prediction_is_the_sum_over_layers_and_phases_of_a_patterns_cells(diagnose):
    # per_sample kl[layer][phase][pattern][budget][sample], 3 layers, 2 phases, 2 patterns, 2 budgets, 2 samples
    kl = np.arange(3 * 2 * 2 * 2 * 2, dtype=float).reshape(3, 2, 2, 2, 2)
    table = {"patterns": ["tova", "h2o"], "budgets": [16, 32], "uncertainty": {"per_sample": {"kl": kl.tolist()}}}
    want = [sum(kl[layer, phase, 1, 0, s] for layer in range(3) for phase in range(2)) for s in range(2)]
    assert diagnose.predicted(table, "h2o", 16).tolist() == want


def test_a_budget_that_holds_the_whole_sample_measures_zero_and_a_small_one_does_not(diagnose):
    model, data = tiny_model("llama", layers=L), samples()
    kl, right = diagnose.measured(model, data, [Strategy.uniform(L, "tova", 200), Strategy.uniform(L, "tova", 8)])
    assert kl.shape == (2, 2) and right.shape == (3, 2)
    assert (kl[0] == 0).all() and (right[1] == right[0]).all()  # nothing evicted: FullKV exactly
    assert (kl[1] > 0).all()
