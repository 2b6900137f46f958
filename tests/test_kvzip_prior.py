"""Pool priors: kvzip's ``weight``, ``floor`` and ``cap`` steer each layer's place in a pool's ranking, against the
oracle (tests/oracle_pooled.py, sharing no code with polykv_search/runtime/pooled.py), in prefill and decoding."""

from __future__ import annotations

import json

import pytest
import torch

from polykv_search.patterns import canonical_spec, make_pattern
from polykv_search.patterns.base import PoolPrior
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.runtime.pooled import steered
from polykv_search.scoring import Entry, per_entry
from polykv_search.scoring.shared import SharedScorer
from strategies import LayerChoice, Strategy
from strategies.kvpress_presses import prefill_press
from tests.test_eval_support import char_tokenizer
from tests.test_kvzip_pooled import held, run_both
from tests.test_runtime import batch
from tests.test_scoring_engines import assert_same, jobs
from tests.tiny import FAMILIES, tiny_model


def prior_strategy(budgets, priors, allocation="model", decoding=True) -> Strategy:
    """kvzip pooled in every layer, layer ``l`` with ``priors[l]`` (weight, floor, cap as a dict)."""
    choices = [LayerChoice("kvzip", b, {"allocation": allocation, "n_sink": 2, **p}) for b, p in zip(budgets, priors)]
    dec = choices if decoding else [LayerChoice("kvzip", b, {"n_sink": 2}) for b in budgets]
    return Strategy(choices, dec, global_budget=sum(budgets) / len(budgets), b_min=1)


def per_layer_totals(got, layers=3, heads=2):
    return [[sum(len(got[l, b, h]) for h in range(heads)) for l in range(layers)] for b in range(2)]


@pytest.mark.parametrize("family", FAMILIES)
def test_weighted_layers_share_one_pool_and_keep_the_oracles_tokens(family):
    budgets = [14, 18, 16]
    strategy = prior_strategy(budgets, [{"weight": 0.25}, {}, {"weight": 4.0}])
    got, want = run_both(family, strategy, steps=5)
    assert got == want
    plain, _ = run_both(family, prior_strategy(budgets, [{}, {}, {}]), steps=5)
    for b in range(2):  # one pool: its total holds, and the weights moved tokens from layer 0 to layer 2
        assert sum(per_layer_totals(got)[b]) == 2 * sum(budgets)
    assert per_layer_totals(got) != per_layer_totals(plain)
    assert per_layer_totals(got)[0][0] < per_layer_totals(plain)[0][0]
    assert per_layer_totals(got)[0][2] > per_layer_totals(plain)[0][2]


def prefill_held(strategy, family="llama"):
    model = tiny_model(family, layers=3, seed=5)
    ids, mask = batch(seed=6, n=30, pad=5)
    with torch.no_grad(), apply_strategy(model, strategy) as rt:
        model(ids, attention_mask=mask, use_cache=True)
        return held(rt.last_cache)


@pytest.mark.parametrize("allocation", ["model", "layer"])
def test_floors_and_caps_bound_each_heads_count_as_the_oracle_does(allocation):
    """After prefill every head holds between min(floor, b) and cap tokens; once the question's tokens outgrow
    the pool the floors' tokens go before them, as the oracle says."""
    budgets = [12, 14, 10]
    priors = [{"floor": 9}, {"cap": 11}, {"floor": 4, "cap": 12}]
    strategy = prior_strategy(budgets, priors, allocation)
    got, want = run_both("llama", strategy, steps=0)
    assert got == want
    after_prefill = prefill_held(strategy)
    for (layer, b, h), positions in after_prefill.items():
        floor, cap = priors[layer].get("floor", 0), priors[layer].get("cap", 0)
        assert len(positions) >= min(floor, budgets[layer]), (layer, b, h)
        assert not cap or len(positions) <= cap, (layer, b, h)
    assert after_prefill != prefill_held(prior_strategy(budgets, [{}, {}, {}], allocation)), "they should bind"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_prior_holds_through_the_question_and_decoding_as_the_oracle_does(family):
    priors = [{"weight": 2.0, "floor": 6}, {"cap": 10}, {"weight": 0.5}]
    got, want = run_both(family, prior_strategy([9, 12, 10], priors), steps=5)
    assert got == want


@pytest.mark.parametrize("allocation", ["model", "layer"])
def test_an_evidence_share_beside_a_prior_is_protected_first_as_the_oracle_says(allocation):
    """kvzip's evidence share (each head's best prompt tokens, kept for good) and the pool prior together: the
    share is protected before the floor and the cap count their tokens, through prefill, the question and decoding."""
    weight = 2.0 if allocation == "model" else 1.0
    # one pool: layers that differ only in weight, floor and cap share it (the evidence share is the same)
    priors = [{"evidence": 0.5, "floor": 6, "weight": weight}, {"evidence": 0.5, "cap": 10}, {"evidence": 0.5}]
    strategy = prior_strategy([9, 12, 10], priors, allocation)
    got, want = run_both("llama", strategy, steps=5)
    assert got == want
    plain, _ = run_both(
        "llama",
        prior_strategy([9, 12, 10], [{k: v for k, v in p.items() if k != "evidence"} for p in priors], allocation),
        steps=5,
    )
    assert got != plain, "the evidence share should bind"


def test_the_default_prior_leaves_the_keys_and_the_pool_as_they_were():
    key = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    same, first = steered(key, PoolPrior(), 5)
    assert same is key and first is None
    assert make_pattern("kvzip", allocation="model", weight=1.0, floor=0, cap=0) == make_pattern(
        "kvzip", allocation="model"
    )
    explicit = [{"weight": 1.0, "floor": 0, "cap": 0}, {"weight": 1}, {}]
    got, want = run_both("mistral", prior_strategy([14, 18, 16], explicit), steps=3)
    plain, _ = run_both("mistral", prior_strategy([14, 18, 16], [{}, {}, {}]), steps=3)
    assert got == want == plain


def test_a_floor_marks_a_heads_top_tokens_and_a_cap_drops_the_rest():
    """The floor's tokens: a head's best unprotected ones (padding never); the cap keeps protected tokens."""
    inf = float("inf")
    key = torch.tensor([[[5.0, 1.0, inf, 3.0, 4.0, 2.0, -inf]]])
    same, first = steered(key, PoolPrior(floor=3), budget=8)
    assert same is key and first[0, 0].tolist() == [True, False, False, False, True, False, False]
    _, first = steered(key, PoolPrior(floor=5), budget=2)  # min(floor, budget): the sink and one more
    assert first[0, 0].tolist() == [True, False, False, False, False, False, False]
    capped, first = steered(key, PoolPrior(cap=2), budget=8)
    assert first is None and capped[0, 0].tolist() == [5.0, -inf, inf, -inf, -inf, -inf, -inf]
    assert steered(key.double(), PoolPrior(weight=0.5), 8)[0][0, 0, 0] == 2.5


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"allocation": "model", "weight": 0}, "weight must be a finite number > 0, got 0"),
        ({"allocation": "model", "weight": -1.5}, "weight must be a finite number > 0, got -1.5"),
        ({"allocation": "model", "weight": float("nan")}, "weight must be a finite number > 0, got nan"),
        ({"allocation": "model", "weight": True}, "weight must be a finite number > 0, got True"),
        ({"allocation": "model", "floor": -1}, "floor must be an integer >= 0, got -1"),
        ({"allocation": "model", "cap": 2.5}, "cap must be an integer >= 0, got 2.5"),
        ({"allocation": "model", "floor": 8, "cap": 4}, "floor must be at most cap, got floor=8 and cap=4"),
        ({"weight": 2.0}, "they need allocation='layer' or 'model'"),
        ({"floor": 4}, "they need allocation='layer' or 'model'"),
        ({"allocation": "layer", "weight": 2.0}, "weight needs allocation='model'"),
    ],
)
def test_a_bad_prior_is_refused_naming_its_value(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_pattern("kvzip", **params)


def test_priors_are_spec_parameters_in_the_schema_and_the_kvpress_export_says_they_are_not_applied():
    assert canonical_spec("kvzip[allocation=model,weight=1.0,floor=0,cap=0]") == "kvzip[allocation=model]"
    assert canonical_spec("kvzip[allocation=model,weight=1.5]") == "kvzip[allocation=model,weight=1.5]"
    zipped = make_pattern("kvzip", allocation="model", weight=1.5, floor=2, cap=40)
    assert zipped.pool_identity() == make_pattern("kvzip", allocation="model")
    assert zipped.alone() == make_pattern("kvzip")
    strategy = prior_strategy([16, 16, 16], [{"weight": 1.5}, {"floor": 2, "cap": 40}, {}])
    again = Strategy.from_json(json.loads(json.dumps(strategy.to_json())))
    assert again.digest() == strategy.digest() and again.prefill[0].params["weight"] == 1.5
    press = prefill_press(LayerChoice("kvzip", 64, {"allocation": "model", "weight": 1.5, "cap": 40}))
    assert press is not None and press.cls == "KVzipPress"
    assert any("weight=1.5" in d and "cap=40" in d and "not applied" in d for d in press.differences)
    plain = prefill_press(LayerChoice("kvzip", 64, {"allocation": "model"}))
    assert plain is not None and not any("not applied" in d for d in plain.differences)


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_the_shared_engine_scores_prior_entries_as_the_per_entry_engine(kind):
    model, tok = tiny_model("qwen3"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    es = [
        Entry("full", Strategy.full(3), "baseline", "full"),
        Entry("prior", prior_strategy([24, 20, 28], [{"weight": 3.0}, {"floor": 10}, {"cap": 26}]), "strategy", "p"),
        Entry("plain", prior_strategy([24, 20, 28], [{}, {}, {}]), "strategy", "m"),
    ]
    reference = per_entry.run_sample(model, es, job)
    with apply_strategy(model, Strategy.full(3)) as rt:
        shared = SharedScorer(model, rt, [strategy_plans(e.strategy) for e in es]).run(job)
    assert_same(reference, shared, job)


def test_a_strategy_with_priors_validates_against_the_schema_and_a_zero_weight_does_not():
    jsonschema = pytest.importorskip("jsonschema")
    from strategies.export_json import load_schema

    validator = jsonschema.Draft202012Validator(load_schema())
    data = json.loads(prior_strategy([16, 16, 16], [{"weight": 1.5}, {"floor": 2, "cap": 40}, {}]).dumps())
    assert not list(validator.iter_errors(data))
    data["layers"][0]["prefill"]["params"]["weight"] = 0
    assert list(validator.iter_errors(data))
