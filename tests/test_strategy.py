"""Strategy JSON: round trip, and every validation error names the offending field."""

from __future__ import annotations

import json

import pytest

from strategies import LayerChoice, Strategy, StrategyError


def mixed() -> Strategy:
    return Strategy(
        [LayerChoice("snapkv", 40, {"window": 8}), LayerChoice("h2o", 24)],
        [LayerChoice("tova", 32), LayerChoice("streaming_llm", 32, {"n_sink": 2})],
        global_budget=32,
        b_min=16,
        provenance={"solver": "test"},
    )


def test_round_trip_preserves_everything(tmp_path):
    s = mixed()
    path = s.save(tmp_path / "s.json")
    back = Strategy.load(path)
    assert back.to_json() == s.to_json()
    assert back.digest() == s.digest()
    assert back.patterns("prefill") == ["snapkv", "h2o"]
    assert back.budgets("decoding") == [32, 32]


def test_uniform_and_full_builders():
    u = Strategy.uniform(4, "tova", 64)
    assert u.budgets("prefill") == [64] * 4 and u.global_budget == 64
    f = Strategy.full(3)
    assert f.is_full and f.budgets("decoding") == [None] * 3


def edit(fn):
    data = mixed().to_json()
    fn(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["layers"][0]["prefill"].update(pattern="nope"),
            r"layers\[0\].prefill.pattern: unknown pattern 'nope'",
        ),
        (lambda d: d["layers"][1]["prefill"].update(budget=8), r"layers\[1\].prefill.budget: 8 is below b_min=16"),
        (lambda d: d["layers"][0]["decoding"].update(budget=40), r"decoding: budgets sum to 72, over L\*B"),
        (lambda d: d["layers"][0]["prefill"].update(budget=-1), r"layers\[0\].prefill.budget: must be non-negative"),
        (lambda d: d["layers"][0]["prefill"].update(budget=20.5), r"layers\[0\].prefill.budget: must be an integer"),
        (lambda d: d.update(version=99), r"version: unsupported schema version 99"),
        (lambda d: d.update(schema="other"), r"schema: expected 'polykv-strategy'"),
        (
            lambda d: d["layers"][0]["prefill"].update(params={"window": 0}),
            r"layers\[0\].prefill.params: window must be",
        ),
        (lambda d: d["layers"][0]["prefill"].update(params={"bogus": 1}), r"layers\[0\].prefill.params: .*bogus"),
        (lambda d: d["layers"][0]["prefill"].update(budget=None), r"only valid with pattern 'full'"),
        (lambda d: d.update(num_layers=3), r"num_layers: says 3 but layers lists 2"),
        (lambda d: d.update(b_min=0), r"b_min: must be a positive integer"),
        (lambda d: d.update(global_budget=0.5), r"global_budget: must be a number >= 1"),
    ],
)
def test_validation_errors_name_the_field(change, message):
    with pytest.raises(StrategyError, match=message):
        Strategy.loads(edit(change))


def test_wrong_layer_count_for_the_model():
    with pytest.raises(StrategyError, match="strategy has 2 layers but the model has 30"):
        mixed().check_model(30)


def test_not_json_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(StrategyError, match="not valid JSON"):
        Strategy.load(bad)
    with pytest.raises(StrategyError, match="cannot read"):
        Strategy.load(tmp_path / "missing.json")
