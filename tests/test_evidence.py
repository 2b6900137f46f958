"""Decoding plans that keep the prompt's evidence: the ``evidence`` pattern (SnapKV's prompt score keeps a share
of the budget, the rest follows tova / h2o / streaming_llm) and ``kvzip[evidence=...]`` (each head's
best-reconstructed prompt tokens), against the full-cache masking oracle (tests/oracle_evidence.py)."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import canonical_spec, make_pattern
from polykv_search.patterns.selection import POS_INF, protect_top_share
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.scoring import Entry, per_entry
from polykv_search.scoring.shared import SharedScorer
from signals.collect import collect_signals
from strategies import LayerChoice, Strategy
from strategies.kvpress_presses import decoding_press, prefill_press
from tests.oracle import Oracle
from tests.test_collect import assert_tables_close, make_samples
from tests.test_eval_support import char_tokenizer
from tests.test_kvzip_pooled import run_both
from tests.test_runtime import batch, kept_sets, run_three_steps
from tests.test_scoring_engines import assert_same, jobs
from tests.tiny import tiny_model

PROMPT = 30  # batch(n=30): row 1 is left-padded, so its real prompt ends at the same slot
FULL = LayerChoice("full", 64)  # keeps every token of these prompts
CONT = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(7))


def two_phase(L: int, prefill: LayerChoice, decoding: LayerChoice) -> Strategy:
    return Strategy([prefill] * L, [decoding] * L, global_budget=max(prefill.budget, decoding.budget), b_min=1)


def runtime_and_oracle(family: str, strategy: Strategy, steps: int, seed: int = 4):
    model = tiny_model(family, layers=2, seed=seed)
    ids, mask = batch(seed=5, n=PROMPT, pad=4)
    with apply_strategy(model, strategy):
        _, cache = run_three_steps(model, strategy, ids, mask, CONT, steps=steps)
    with Oracle(model, strategy) as oracle:
        run_three_steps(model, strategy, ids, mask, CONT, steps=steps)
    return cache, oracle


def prompt_held(cache) -> list[int]:
    """Per (layer, row, KV head) the prompt tokens still held."""
    pairs = [(p, v) for layer in cache.layers for row in zip(layer.positions, layer.valid) for p, v in zip(*row)]
    return [int(((p < PROMPT) & v).sum()) for p, v in pairs]


def test_protect_top_share_protects_the_best_candidates_within_the_budget():
    key = torch.tensor([[[POS_INF, 0.3, 0.9, 0.2, float("-inf"), 0.5, 0.1]]])
    score = torch.tensor([[[9.0, 1.0, 5.0, 5.0, 9.0, 2.0, 7.0]]])
    prompt = torch.tensor([True, True, True, True, True, True, False])
    got = protect_top_share(key, score, prompt, 0.5, [6])  # floor(0.5 * 6) = 3 of the prompt's unprotected
    assert (got == POS_INF).nonzero()[:, -1].tolist() == [0, 2, 3, 5]  # 2 and 3 tie at 5: both; 5 next (2.0)
    tight = protect_top_share(key, score, prompt, 0.9, [3])  # floor(2.7) = 2, and 3 - 1 protected = 2
    assert (tight == POS_INF).nonzero()[:, -1].tolist() == [0, 2, 3]
    rows = protect_top_share(key.expand(2, 1, 7), score.expand(2, 1, 7), prompt, 0.5, [2, 6])
    assert (rows[0] == POS_INF).nonzero()[:, -1].tolist() == [0, 2]  # floor(1.0) = 1: the older of the tie
    assert torch.equal(protect_top_share(key, score, prompt, 0.0, [6]), key)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("rule", ["tova", "h2o", "streaming_llm"])
def test_the_evidence_pattern_keeps_the_oracles_tokens_through_a_long_decoding(family, rule):
    """12 decoding steps after a 4-token call push 16 appended tokens through a budget of 10; the share's
    floor(0.4 * 10) = 4 best prompt tokens stay in every head beside what the rule keeps."""
    decoding = LayerChoice("evidence", 10, {"share": 0.4, "rule": rule, "window": 6})
    prefill = LayerChoice("streaming_llm", 20) if rule == "tova" else LayerChoice("snapkv", 16, {"window": 4})
    strategy = two_phase(2, prefill, decoding)  # (tova: a prefill that keeps one set for every head, as it needs)
    cache, oracle = runtime_and_oracle(family, strategy, steps=12)
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"layer {layer} row {b} head {h}"
    sinks = 4 if rule == "streaming_llm" else 0
    assert all(n >= 4 + sinks for n in prompt_held(cache))


@pytest.mark.parametrize("rule", ["tova", "h2o", "streaming_llm"])
def test_a_share_of_zero_is_the_rule_alone(rule):
    model = tiny_model("llama", layers=2, seed=4)
    ids, mask = batch(seed=5, n=PROMPT, pad=4)
    held_sets = []
    for choice in (LayerChoice(rule, 9), LayerChoice("evidence", 9, {"share": 0.0, "rule": rule})):
        strategy = two_phase(2, FULL, choice)
        with apply_strategy(model, strategy):
            _, cache = run_three_steps(model, strategy, ids, mask, CONT, steps=6)
        held_sets.append([layer.positions.tolist() for layer in cache.layers])
    assert held_sets[0] == held_sets[1]


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_kvzip_evidence_per_head_keeps_the_oracles_tokens_and_the_prompts_best(family):
    params = {"n_sink": 2, "boundary": 3, "evidence": 0.3}
    strategy = two_phase(2, LayerChoice("kvzip", 14, params), LayerChoice("kvzip", 10, params))
    cache, oracle = runtime_and_oracle(family, strategy, steps=12)
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"layer {layer} row {b} head {h}"
    assert all(n == 2 + 3 + 3 for n in prompt_held(cache))  # sinks, boundary, floor(0.3 * 10); then appended


def test_kvzip_evidence_keeps_the_prefill_of_the_rule_and_only_changes_decoding():
    """Per head, the prompt's top tokens are what the prefill keeps anyway; today's rule (evidence 0) holds no
    prompt token but its sinks after 16 appended tokens at budget 10, the share holds 2 + floor(0.6 * 10)."""
    model = tiny_model("llama", layers=2, seed=4)
    ids, mask = batch(seed=5, n=PROMPT, pad=4)
    prefill, decoded = {}, {}
    for share in (0.0, 0.6):
        params = {"n_sink": 2, "evidence": share}
        strategy = two_phase(2, LayerChoice("kvzip", 12, params), LayerChoice("kvzip", 10, params))
        with apply_strategy(model, strategy) as rt, torch.no_grad():
            model(ids, attention_mask=mask, use_cache=True)
            prefill[share] = [layer.positions.tolist() for layer in rt.last_cache.layers]
        with apply_strategy(model, strategy):
            _, cache = run_three_steps(model, strategy, ids, mask, CONT, steps=12)
        decoded[share] = prompt_held(cache)
    assert prefill[0.0] == prefill[0.6]
    assert set(decoded[0.0]) == {2} and set(decoded[0.6]) == {2 + 6}


@pytest.mark.parametrize("allocation", ["model", "layer"])
def test_a_pool_keeps_each_cells_evidence_share_as_the_oracle_does(allocation):
    """In a pool each cell's share is protected ahead of the pool's ranking (a per-head floor), in prefill
    and once the appended tokens outgrow the pool."""
    params = {"allocation": allocation, "n_sink": 2, "evidence": 0.4}
    budgets = [9, 12, 10]
    choices = [LayerChoice("kvzip", b, params) for b in budgets]
    strategy = Strategy(choices, choices, global_budget=31 / 3, b_min=1)
    got, want = run_both("llama", strategy, steps=5)
    assert got == want
    for (layer, b, h), positions in got.items():  # sinks plus floor(0.4 * budget) prompt tokens at least
        assert sum(p < PROMPT for p in positions) >= 2 + int(0.4 * budgets[layer]), (layer, b, h)


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_the_shared_engine_scores_evidence_entries_as_the_per_entry_engine(kind):
    """The share's state follows the rows the shared engine stacks and splits (row-batched = alone)."""
    model, tok = tiny_model("qwen3"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    zip_ = {"n_sink": 2, "evidence": 0.5}
    es = [
        Entry("full", Strategy.full(3), "baseline", "full"),
        Entry("kvzip", two_phase(3, LayerChoice("kvzip", 12, zip_), LayerChoice("kvzip", 10, zip_)), "strategy", "k"),
        Entry("pool", Strategy.uniform(3, "kvzip", 16, params={**zip_, "allocation": "model"}), "strategy", "p"),
        Entry("tova", two_phase(3, FULL, LayerChoice("evidence", 9, {"window": 8})), "strategy", "t"),
        Entry("h2o", Strategy.uniform(3, "evidence", 11, params={"rule": "h2o", "share": 0.3}), "strategy", "h"),
    ]
    reference = per_entry.run_sample(model, es, job)
    with apply_strategy(model, Strategy.full(3)) as rt:
        shared = SharedScorer(model, rt, [strategy_plans(e.strategy) for e in es]).run(job)
    assert_same(reference, shared, job)


def test_evidence_specs_are_validated_canonical_and_exported_with_their_difference():
    assert canonical_spec("kvzip[evidence=0]") == "kvzip"
    assert canonical_spec("kvzip[allocation=model,evidence=0.25]") == "kvzip[allocation=model,evidence=0.25]"
    assert canonical_spec("evidence[share=0.5,rule=tova]") == "evidence"
    assert canonical_spec("evidence[rule=h2o,share=0.25]") == "evidence[rule=h2o,share=0.25]"
    for spec, message in (
        ({"evidence": 1.0}, "evidence must be a number in \\[0, 1\\), got 1.0"),
        ({"evidence": -0.1}, "evidence must be a number in \\[0, 1\\), got -0.1"),
    ):
        with pytest.raises(ValueError, match=message):
            make_pattern("kvzip", **spec)
    for spec, message in (
        ({"share": 1}, "share must be a number in \\[0, 1\\), got 1"),
        ({"rule": "snapkv"}, "rule must be one of tova, h2o, streaming_llm, got 'snapkv'"),
        ({"window": 0}, "window must be a positive integer, got 0"),
    ):
        with pytest.raises(ValueError, match=message):
            make_pattern("evidence", **spec)
    tova = prefill_press(LayerChoice("evidence", 64, {}))
    assert tova is not None and tova.cls == "TOVAPress"
    assert any("share=0.5 is not applied" in d for d in tova.differences)
    assert decoding_press(LayerChoice("evidence", 64, {"rule": "h2o"}))[0] is None  # as h2o's own decoding
    window, _ = decoding_press(LayerChoice("evidence", 64, {"rule": "streaming_llm", "share": 0.0}))
    assert window is not None and window.cls == "StreamingLLMPress" and not window.differences
    pool = prefill_press(LayerChoice("kvzip", 64, {"allocation": "model", "evidence": 0.5}))
    assert pool is not None and any("evidence=0.5 is not applied" in d for d in pool.differences)
    head = prefill_press(LayerChoice("kvzip", 64, {"evidence": 0.5}))  # per head the prefill is the same
    assert head is not None and not any("evidence" in d for d in head.differences)


def test_the_signal_replay_of_evidence_cells_equals_the_naive_collection():
    """Decoding cells evict for 8 steps past budget 6: the share's state follows the replay's forked rows."""
    model = tiny_model("llama", layers=3)
    samples = make_samples(2, n=28, m=8)
    patterns = ["evidence[rule=h2o,share=0.3,window=8]", "kvzip[evidence=0.5]", "kvzip[allocation=layer,evidence=0.4]"]
    kw = dict(patterns=patterns, budgets=[6, 20], layers=[1])
    fast = collect_signals(model, samples, journal=False, **kw)
    assert_tables_close(fast, collect_signals(model, samples, naive=True, journal=False, **kw))
