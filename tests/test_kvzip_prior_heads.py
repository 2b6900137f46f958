"""Pool priors per KV head: kvzip's ``weight``, ``floor`` and ``cap`` given as one value per KV head of the layer
(spec ``weight=4/0.25``, JSON a list) steer each cell of a pool by its own value, against the oracle
(tests/oracle_pooled.py, sharing no code with polykv_search/runtime/pooled.py), in prefill and decoding."""

from __future__ import annotations

import json

import pytest
import torch

from polykv_search.patterns import canonical_spec, make_spec
from polykv_search.patterns.base import PoolPrior
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.runtime.pooled import steered
from polykv_search.scoring import Entry, per_entry
from polykv_search.scoring.shared import SharedScorer
from strategies import LayerChoice, Strategy, StrategyError
from strategies.kvpress_presses import prefill_press
from tests.test_eval_support import char_tokenizer
from tests.test_kvzip_pooled import run_both
from tests.test_kvzip_prior import per_layer_totals, prefill_held, prior_strategy
from tests.test_scoring_engines import assert_same, jobs
from tests.tiny import FAMILIES, tiny_model

BUDGETS = [14, 18, 16]


def head_totals(got, head: int, layers=3):
    """Per row, the tokens KV ``head`` holds over every layer."""
    return [sum(len(got[layer, b, head]) for layer in range(layers)) for b in range(2)]


@pytest.mark.parametrize("family", FAMILIES)
def test_per_head_weights_steer_each_cell_and_keep_the_oracles_tokens(family):
    priors = [{"weight": (4.0, 0.25)}, {"weight": (0.5, 2.0)}, {"weight": (3.0, 0.5)}]
    got, want = run_both(family, prior_strategy(BUDGETS, priors), steps=5)
    assert got == want
    plain, _ = run_both(family, prior_strategy(BUDGETS, [{}, {}, {}]), steps=5)
    for b in range(2):  # one pool: its total holds
        assert sum(per_layer_totals(got)[b]) == 2 * sum(BUDGETS)
    assert got != plain
    assert [len(got[0, b, 0]) for b in range(2)] >= [len(plain[0, b, 0]) for b in range(2)]
    assert [len(got[0, b, 1]) for b in range(2)] <= [len(plain[0, b, 1]) for b in range(2)]


@pytest.mark.parametrize("allocation", ["model", "layer"])
def test_per_head_floors_and_caps_bound_each_heads_count_as_the_oracle_does(allocation):
    priors = [{"floor": (12, 0)}, {"cap": (0, 8)}, {"floor": (3, 7), "cap": (9, 12)}]
    strategy = prior_strategy(BUDGETS, priors, allocation)
    got, want = run_both("llama", strategy, steps=0)
    assert got == want
    plain, _ = run_both("llama", prior_strategy(BUDGETS, [{}, {}, {}], allocation), steps=0)
    assert got != plain, "the per-head floors and caps should bind"
    for (layer, b, h), positions in prefill_held(strategy).items():  # every head within its own floor and cap
        p = priors[layer]
        floor, cap = p.get("floor", (0, 0))[h], p.get("cap", (0, 0))[h]
        assert len(positions) >= min(floor, BUDGETS[layer]), (layer, b, h)
        assert not cap or len(positions) <= cap, (layer, b, h)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_mixed_per_head_and_per_layer_priors_hold_through_decoding_as_the_oracle_does(family):
    priors = [{"weight": (2.0, 0.5), "floor": 6}, {"cap": (10, 0), "weight": 1.5}, {"floor": (0, 5)}]
    got, want = run_both(family, prior_strategy([9, 12, 10], priors), steps=5)
    assert got == want


def test_per_head_weights_rank_one_layers_heads_in_a_layer_pool():
    """With ``allocation="layer"`` one weight for every head changes nothing, so it is refused; per-head weights
    move tokens between the layer's heads, at the layer's total."""
    priors = [{"weight": (4.0, 0.25)}, {}, {"weight": (0.5, 3.0)}]
    got, want = run_both("mistral", prior_strategy(BUDGETS, priors, "layer"), steps=3)
    plain, _ = run_both("mistral", prior_strategy(BUDGETS, [{}, {}, {}], "layer"), steps=3)
    assert got == want and got != plain
    assert per_layer_totals(got) == per_layer_totals(plain)  # each layer's pool holds its total
    with pytest.raises(ValueError, match="weight needs allocation='model' or one value per KV head"):
        make_spec("kvzip[allocation=layer,weight=2]")


def test_per_head_values_at_their_defaults_change_no_kept_set():
    defaults = [{"weight": (1.0, 1.0), "floor": (0, 0), "cap": (0, 0)}, {"weight": [1, 1]}, {}]
    got, want = run_both("qwen3", prior_strategy(BUDGETS, defaults), steps=3)
    plain, _ = run_both("qwen3", prior_strategy(BUDGETS, [{}, {}, {}]), steps=3)
    assert got == want == plain
    assert canonical_spec("kvzip[allocation=model,weight=1/1,floor=0/0,cap=0/0]") == "kvzip[allocation=model]"
    assert canonical_spec("kvzip[allocation=model,weight=2/2]") == "kvzip[allocation=model,weight=2]"
    key = torch.randn(2, 2, 9, generator=torch.Generator().manual_seed(1))
    same, first = steered(key, PoolPrior((1.0, 1.0), (0, 0), (0, 0)), 5)
    assert same is key and first is None


def test_steered_applies_each_heads_own_weight_floor_and_cap():
    inf = float("inf")
    key = torch.tensor([[[5.0, 1.0, inf, 3.0, 4.0], [2.0, 6.0, inf, 1.0, 3.0]]], dtype=torch.float64)
    out, first = steered(key, PoolPrior(weight=(0.5, 2.0), floor=(3, 0), cap=(0, 2)), budget=8)
    assert out[0, 0].tolist() == [2.5, 0.5, inf, 1.5, 2.0]  # head 0: weighed by 0.5, no cap
    assert out[0, 1].tolist() == [-inf, 12.0, inf, -inf, -inf]  # head 1: weighed by 2, its top 2 (the sink first)
    assert first[0].tolist() == [[True, False, False, False, True], [False] * 5]
    with pytest.raises(ValueError, match=r"weight has 3 values, one per KV head, but the layer has KV heads \[0, 1\]"):
        steered(key, PoolPrior(weight=(1.0, 2.0, 3.0)), 8)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kvzip[allocation=model,weight=2/0/1]", "weight must be a finite number > 0, got 0"),
        ("kvzip[allocation=model,floor=1/-2]", "floor must be an integer >= 0, got -2"),
        ("kvzip[allocation=model,cap=4/2.5]", "cap must be an integer >= 0, got 2.5"),
        ("kvzip[allocation=model,floor=5/1,cap=4/8]", "floor must be at most cap, got floor=5 and cap=4"),
        ("kvzip[allocation=model,floor=1/2,cap=4/5/6]", "floor and cap give 2 and 3 per-head values"),
        ("kvzip[weight=2/1]", "they need allocation='layer' or 'model', got weight=2/1"),
    ],
)
def test_a_bad_per_head_prior_is_refused_naming_its_value(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_spec(text)


def test_a_per_head_prior_of_another_length_than_the_models_kv_heads_is_refused_before_anything_runs():
    model = tiny_model("llama", layers=3, seed=5)
    strategy = prior_strategy(BUDGETS, [{"weight": (1.0, 2.0, 3.0)}, {}, {}])
    with pytest.raises(StrategyError, match=r"layers\[0\]\.prefill\.params\.weight: 3 values, one per KV head"):
        with apply_strategy(model, strategy):
            pass


def test_per_head_priors_are_spec_lists_in_the_schema_and_the_kvpress_export_says_they_are_not_applied():
    jsonschema = pytest.importorskip("jsonschema")
    from strategies.export_json import load_schema

    name = "kvzip[allocation=model,weight=2/0.5,floor=3/0,cap=0/40]"
    assert canonical_spec(name) == name
    strategy = prior_strategy([16, 16, 16], [{"weight": (2.0, 0.5), "floor": (3, 0)}, {"cap": (0, 40)}, {}])
    data = json.loads(strategy.dumps())
    assert data["layers"][0]["prefill"]["params"]["weight"] == [2.0, 0.5]
    assert not list(jsonschema.Draft202012Validator(load_schema()).iter_errors(data))
    again = Strategy.from_json(data)
    assert again.digest() == strategy.digest()
    assert make_spec(again.prefill[0].label().rpartition("@")[0]).prior == PoolPrior((2.0, 0.5), (3, 0), 0)
    data["layers"][0]["prefill"]["params"]["weight"] = [2.0, 0]
    assert list(jsonschema.Draft202012Validator(load_schema()).iter_errors(data))
    press = prefill_press(LayerChoice("kvzip", 64, {"allocation": "model", "weight": (2.0, 0.5), "cap": (0, 40)}))
    assert press is not None and press.cls == "KVzipPress"
    assert any("weight=2.0/0.5" in d and "cap=0/40" in d and "not applied" in d for d in press.differences)


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_the_shared_engine_scores_per_head_prior_entries_as_the_per_entry_engine(kind):
    model, tok = tiny_model("llama"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    priors = [{"weight": (3.0, 0.5)}, {"floor": (10, 2)}, {"cap": (26, 0)}]
    es = [
        Entry("full", Strategy.full(3), "baseline", "full"),
        Entry("heads", prior_strategy([24, 20, 28], priors), "strategy", "h"),
        Entry("plain", prior_strategy([24, 20, 28], [{}, {}, {}]), "strategy", "m"),
    ]
    reference = per_entry.run_sample(model, es, job)
    with apply_strategy(model, Strategy.full(3)) as rt:
        shared = SharedScorer(model, rt, [strategy_plans(e.strategy) for e in es]).run(job)
    assert_same(reference, shared, job)
