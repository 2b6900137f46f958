"""kvzip: a model-level pattern whose prefill eviction waits for a reconstruction pass.

The runtime (deferral, the pass, the deferred eviction) against the full-cache masking oracle, which
runs its own pass with its own model calls; the pass once per prompt, once per sample in the shared
scoring engine; the refusal without repeat prompts."""

from __future__ import annotations

import pytest
import torch

from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.runtime import runtime as runtime_mod
from polykv_search.scoring import Entry, per_entry
from polykv_search.scoring.shared import SharedScorer
from strategies import LayerChoice, Strategy
from tests.oracle import Oracle
from tests.test_eval_support import char_tokenizer
from tests.test_runtime import batch, close, kept_sets, run_three_steps
from tests.test_scoring_engines import assert_same, jobs
from tests.tiny import FAMILIES, tiny_model


def kvzip_mix(L: int, chunk: int) -> Strategy:
    """kvzip in some layers and phases only (the others defer too, then evict with their own patterns)."""
    zip_ = {"chunk_size": chunk, "n_sink": 2}
    prefill = [("kvzip", 9, zip_), ("snapkv", 12, {"window": 4}), ("kvzip", 14, zip_), ("h2o", 10, {})]
    decoding = [("kvzip", 11, zip_), ("kvzip", 12, zip_), ("h2o", 13, {}), ("streaming_llm", 10, {"n_sink": 2})]
    pick = lambda items: [LayerChoice(p, b, prm) for p, b, prm in (items * L)[:L]]  # noqa: E731
    return Strategy(pick(prefill), pick(decoding), global_budget=12, b_min=8)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [2048, 8])
def test_kvzip_strategy_matches_the_oracle_with_its_own_reconstruction_pass(family, chunk):
    model = tiny_model(family, layers=4, seed=11)
    strategy = kvzip_mix(4, chunk)
    ids, mask = batch(seed=12, n=30, pad=5)  # a left-padded row: its pass reads only its real tokens
    cont = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(13))
    with apply_strategy(model, strategy):
        fast, cache = run_three_steps(model, strategy, ids, mask, cont, steps=5)
    with Oracle(model, strategy) as oracle:
        ref, _ = run_three_steps(model, strategy, ids, mask, cont, steps=5)
    assert close(fast[0], ref[0], mask)  # the prefill logits: compression comes after the kernel
    for step, (a, b) in enumerate(zip(fast[1:], ref[1:])):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4), f"call {step + 1} differs"
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"layer {layer} row {b} head {h}"


def count_passes(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = runtime_mod.run_pass

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime_mod, "run_pass", spy)
    return calls


def test_the_pass_runs_once_per_prompt_and_leaves_positions_as_without_it(monkeypatch):
    model = tiny_model("llama", layers=2, seed=3)
    strategy = Strategy.uniform(2, "kvzip", 10)
    ids, mask = batch(seed=4, n=26, pad=3)
    passes = count_passes(monkeypatch)
    with torch.no_grad(), apply_strategy(model, strategy) as rt:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        report = rt.report()
    assert len(passes) == 1
    assert out.shape[1] == 26 + 6
    assert all(layer.seen == 26 + 5 for layer in rt.last_cache.layers)  # the pass's tokens are not counted
    assert [r.kept for r in report.layers] == [10, 10]


def test_a_strategy_with_kvzip_and_no_repeat_prompt_is_refused_in_one_line():
    model = tiny_model("llama", layers=2)
    del model.polykv_reconstruction
    with pytest.raises(ValueError, match="model-level pattern") as err:
        with apply_strategy(model, Strategy.uniform(2, "kvzip", 10)):
            pass
    assert "\n" not in str(err.value)
    with apply_strategy(model, Strategy.uniform(2, "snapkv", 10)):  # other patterns need nothing
        pass


def test_kvzip_without_its_pass_refuses_to_evict():
    model = tiny_model("llama", layers=2)
    with apply_strategy(model, Strategy.uniform(2, "kvzip", 10)) as rt:
        cache = rt.new_cache()
        layer = cache.layers[0]
        k = torch.randn(1, 2, 20, 16)
        layer.update(k, k)
        layer.attention_call(torch.randn(1, 4, 20, 16), None)
        assert layer.deferred and layer.length == 20
        with pytest.raises(RuntimeError, match="reconstruction pass"):
            layer.update(k[:, :, :1], k[:, :, :1])
            layer.attention_call(torch.randn(1, 4, 1, 16), None)


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_shared_engine_runs_one_pass_per_sample_for_every_kvzip_entry(monkeypatch, kind):
    model, tok = tiny_model("qwen3"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    es = [
        Entry("full", Strategy.full(3), "baseline", "full"),
        Entry("uniform-kvzip", Strategy.uniform(3, "kvzip", 24), "baseline", "kvzip"),
        Entry("kvzip-small", Strategy.uniform(3, "kvzip", 12), "strategy", "k"),
        Entry("snapkv", Strategy.uniform(3, "snapkv", 24), "baseline", "snapkv"),
        Entry(
            "kvzip-decoding",
            Strategy.from_choices([("snapkv", 30)] * 3, [("kvzip", 20)] * 3, None),
            "strategy",
            "kd",
        ),
    ]
    reference = per_entry.run_sample(model, es, job)
    passes = count_passes(monkeypatch)
    with apply_strategy(model, Strategy.full(3)) as rt:
        shared = SharedScorer(model, rt, [strategy_plans(e.strategy) for e in es]).run(job)
    assert len(passes) == 1
    assert_same(reference, shared, job)
