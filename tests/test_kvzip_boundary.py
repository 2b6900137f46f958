"""kvzip's protected prompt boundary (``boundary``: the prompt's last tokens always kept, beside the sinks),
against the full-cache masking oracle, per head and pooled, in prefill and decoding."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import canonical_spec, make_pattern
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.scoring import Entry, per_entry
from polykv_search.scoring.shared import SharedScorer
from strategies import LayerChoice, Strategy
from strategies.kvpress_presses import prefill_press
from tests.oracle import Oracle
from tests.test_eval_support import char_tokenizer
from tests.test_kvzip_pooled import held, run_both
from tests.test_runtime import batch, kept_sets, run_three_steps
from tests.test_scoring_engines import assert_same, jobs
from tests.tiny import FAMILIES, tiny_model

PROMPT = 30  # batch(n=30): row 1 has 5 padding tokens on the left, so its real prompt ends at the same slot


def boundary_strategy(L: int, budgets, allocation: str, boundary: int, decoding=None) -> Strategy:
    params = {"allocation": allocation, "n_sink": 2, "boundary": boundary}
    prefill = [LayerChoice("kvzip", b, params) for b in budgets]
    dec = prefill if decoding is None else [LayerChoice("kvzip", b, params) for b in decoding]
    return Strategy(prefill, dec, global_budget=max(sum(budgets), sum(decoding or budgets)) / L, b_min=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_boundary_per_head_keeps_the_oracles_tokens_through_prefill_and_decoding(family):
    model = tiny_model(family, layers=3, seed=5)
    # budget 7 with 2 sinks protects 5 of the 6 boundary tokens; 12 and 16 protect all 6
    strategy = boundary_strategy(3, [7, 12, 16], "head", 6, decoding=[9, 12, 16])
    ids, mask = batch(seed=6, n=PROMPT, pad=5)
    cont = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(7))
    with apply_strategy(model, strategy):
        _, cache = run_three_steps(model, strategy, ids, mask, cont, steps=5)
    with Oracle(model, strategy) as oracle:
        run_three_steps(model, strategy, ids, mask, cont, steps=5)
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"layer {layer} row {b} head {h}"


@pytest.mark.parametrize("allocation", ["model", "layer"])
def test_a_pool_counts_the_boundary_among_its_protected_tokens_as_the_oracle_does(allocation):
    got, want = run_both("llama", boundary_strategy(3, [9, 12, 10], allocation, 4), steps=5)
    assert got == want
    for (layer, b, h), positions in got.items():  # every cell still holds the prompt's last 4 tokens
        assert set(range(PROMPT - 4, PROMPT)) <= set(positions), (layer, b, h)


def test_the_boundary_is_what_keeps_the_prompts_end_at_a_tight_budget():
    model = tiny_model("llama", layers=3, seed=5)
    ids, mask = batch(seed=6, n=PROMPT, pad=5)
    ends = {}
    for boundary in (0, 3):
        strategy = boundary_strategy(3, [5, 5, 5], "head", boundary)
        with apply_strategy(model, strategy) as rt, torch.no_grad():
            model(ids, attention_mask=mask, use_cache=True)
            ends[boundary] = [set(range(PROMPT - 3, PROMPT)) <= set(p) for p in held(rt.last_cache).values()]
    assert all(ends[3]) and not all(ends[0])


def test_boundary_is_a_spec_parameter_validated_and_exported_with_its_difference():
    assert canonical_spec("kvzip[boundary=0]") == "kvzip"
    assert canonical_spec("kvzip[allocation=model,boundary=8]") == "kvzip[allocation=model,boundary=8]"
    with pytest.raises(ValueError, match="boundary must be an integer >= 0, got -1"):
        make_pattern("kvzip", boundary=-1)
    press = prefill_press(LayerChoice("kvzip", 64, {"boundary": 8}))
    assert press is not None and press.cls == "KVzipPress"
    assert any("boundary=8 is not applied" in d for d in press.differences)
    plain = prefill_press(LayerChoice("kvzip", 64, {}))
    assert plain is not None and not any("boundary" in d for d in plain.differences)


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_the_shared_engine_scores_boundary_entries_as_the_per_entry_engine(kind):
    """The boundary's state follows the rows the shared engine stacks and splits (row-batched = alone)."""
    model, tok = tiny_model("qwen3"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    es = [
        Entry("full", Strategy.full(3), "baseline", "full"),
        Entry("head", boundary_strategy(3, [12, 8, 16], "head", 6, decoding=[10, 8, 14]), "strategy", "h"),
        Entry("model", boundary_strategy(3, [24, 20, 28], "model", 5), "strategy", "m"),
        Entry("plain", Strategy.uniform(3, "kvzip", 12), "baseline", "kvzip"),
    ]
    reference = per_entry.run_sample(model, es, job)
    with apply_strategy(model, Strategy.full(3)) as rt:
        shared = SharedScorer(model, rt, [strategy_plans(e.strategy) for e in es]).run(job)
    assert_same(reference, shared, job)
