"""The shared engine scores strategies with head groups exactly like the per-entry path: each head-group
entry shares the context call (its groups observe the prompt with their own query heads, their pattern
states shared with no other heads) and decodes in the batch of the layer-level rows, each of its split
layers a part of its own (a GroupedLayer of row groups, runtime/layouts.py)."""

from __future__ import annotations

import pytest

from polykv_search import scoring
from polykv_search.runtime import apply_strategy, model_spec, strategy_plans
from polykv_search.runtime.runtime import strategy_head_groups
from polykv_search.scoring import per_entry
from polykv_search.scoring.shared import SharedScorer
from strategies import HeadGroup, LayerChoice, Strategy
from tests.test_decode_suite import trajectory_job
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.test_scoring_engines import assert_same, jobs
from tests.tiny import FAMILIES, tiny_model

L = 3


def grouped(*groups) -> LayerChoice:
    return LayerChoice.grouped(HeadGroup(*g) for g in groups)


def head_entries(budget: int = 24) -> list[scoring.Entry]:
    """Layer-level entries beside strategies with head groups (tiny models: 2 KV heads)."""
    duo = grouped(((0,), "full", 4096), ((1,), "streaming_llm", 12, {"n_sink": 2}))
    scored = grouped(((1,), "snapkv", budget + 8), ((0,), "h2o", budget - 8))
    decode = grouped(((1,), "tova", budget), ((0,), "h2o", budget))
    mixed = Strategy(
        [duo, scored, LayerChoice("snapkv", budget)],
        [duo, decode, LayerChoice("h2o", budget)],
        global_budget=4096,
        b_min=8,
        context_len=4096,
        num_kv_heads=2,
    )
    every_layer = Strategy([scored] * L, [decode] * L, global_budget=budget, b_min=8, context_len=4096, num_kv_heads=2)
    prefill_only = Strategy(
        [scored] * L, [LayerChoice("full", None)] * L, global_budget=None, context_len=4096, num_kv_heads=2
    )
    return [
        scoring.Entry("full", Strategy.full(L), "baseline", "full"),
        scoring.Entry("uniform-snapkv", Strategy.uniform(L, "snapkv", budget), "baseline", "snapkv"),
        scoring.Entry("heads-mixed", mixed, "strategy", "m"),
        scoring.Entry("heads-every-layer", every_layer, "strategy", "e"),
        scoring.Entry("uniform-h2o", Strategy.uniform(L, "h2o", budget), "baseline", "h2o"),
        scoring.Entry("heads-prefill-only", prefill_only, "strategy", "p"),
    ]


def run_both(model, es, job):
    reference = per_entry.run_sample(model, es, job)
    heads = model_spec(model).num_kv_heads
    with apply_strategy(model, Strategy.full(L)) as rt:
        scorer = SharedScorer(
            model,
            rt,
            [strategy_plans(e.strategy) for e in es],
            head_groups=[strategy_head_groups(e.strategy, heads) for e in es],
        )
        shared = scorer.run(job)
    return reference, shared


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_head_group_entries_score_on_the_shared_engine_as_on_the_per_entry_path(family, kind):
    model, tok = tiny_model(family), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    es = head_entries()
    reference, shared = run_both(model, es, job)
    assert_same(reference, shared, job)
    full_bytes = reference[0].kv_bytes
    assert all(o.kv_bytes < full_bytes for o in shared[1:4])  # the groups really hold less


def test_head_group_entries_follow_a_trajectory_like_the_per_entry_path():
    model, tok = tiny_model("llama"), char_tokenizer()
    job = trajectory_job(tok, question=True)
    es = head_entries(16)
    reference, shared = run_both(model, es, job)
    for ref, got in zip(reference, shared):
        assert got.new_ids == ref.new_ids and got.kv_bytes == ref.kv_bytes
        assert got.pred["agree_tokens"] == ref.pred["agree_tokens"]  # tolerances as in test_decode_suite
        assert got.pred["kl"] == pytest.approx(ref.pred["kl"], rel=1e-3, abs=1e-7)
        assert got.pred["dnll"] == pytest.approx(ref.pred["dnll"], rel=1e-3, abs=1e-6)
        assert got.pred["kl_buckets"] == pytest.approx(ref.pred["kl_buckets"], rel=1e-3, abs=1e-7)
    assert reference[3].kv_bytes < reference[0].kv_bytes  # head groups in every layer: not scored as FullKV


def test_score_entries_with_head_groups_shared_equals_per_entry_on_tasks():
    model, tok = tiny_model("qwen2"), char_tokenizer()
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=300, seed=0)
    es = head_entries(32)
    shared = scoring.score_entries(model, tok, es, samples, engine="shared", max_new_tokens=6)
    per = scoring.score_entries(model, tok, es, samples, engine="per-entry", max_new_tokens=6)
    for a, b in zip(shared, per):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
        for task in a["tasks"]:
            pa, pb = a["tasks"][task]["per_sample"], b["tasks"][task]["per_sample"]
            assert [r["score"] for r in pa] == [r["score"] for r in pb]
        assert a["extra"]["broad/continuation"]["kl"] == pytest.approx(b["extra"]["broad/continuation"]["kl"], abs=1e-6)


def kvzip_head_entries() -> list[scoring.Entry]:
    """Head groups beside kvzip: per-head kvzip next to a keep-all head, and single-head groups pooled over the
    model (kvzip[allocation=model] at different budgets), beside layer-level kvzip entries."""
    pooled = {"allocation": "model", "n_sink": 2}
    per_head = grouped(((0,), "full", 4096), ((1,), "kvzip", 16))
    pool = [
        grouped(((0,), "full", 4096), ((1,), "kvzip", 14, pooled)),
        grouped(((0,), "kvzip", 10, pooled), ((1,), "kvzip", 20, pooled)),
        grouped(((0,), "snapkv", 12), ((1,), "kvzip", 18, pooled)),
    ]
    kw = dict(global_budget=None, context_len=4096, num_kv_heads=2)
    return [
        scoring.Entry("full", Strategy.full(L), "baseline", "full"),
        scoring.Entry("heads-kvzip", Strategy([per_head] * L, [per_head] * L, **kw), "strategy", "k"),
        scoring.Entry("heads-pooled", Strategy(pool, pool, **kw), "strategy", "p"),
        scoring.Entry("uniform-kvzip", Strategy.uniform(L, "kvzip", 16), "baseline", "kvzip"),
        scoring.Entry("uniform-snapkv", Strategy.uniform(L, "snapkv", 16), "baseline", "snapkv"),
    ]


@pytest.mark.parametrize("kind", ["teacher_forced", "generate", "trajectory"])
def test_head_groups_beside_kvzip_score_on_the_shared_engine_as_on_the_per_entry_path(kind):
    """The entries needing the reconstruction pass defer their groups' prefill eviction until it has run."""
    model, tok = tiny_model("qwen3"), char_tokenizer()
    forced, gen = jobs(tok)
    job = {"teacher_forced": forced, "generate": gen, "trajectory": trajectory_job(tok, question=True)}[kind]
    es = kvzip_head_entries()
    reference, shared = run_both(model, es, job)
    if kind == "trajectory":
        for ref, got in zip(reference, shared):
            assert got.new_ids == ref.new_ids and got.kv_bytes == ref.kv_bytes
            assert got.pred["agree_tokens"] == ref.pred["agree_tokens"]
            assert got.pred["kl"] == pytest.approx(ref.pred["kl"], rel=1e-3, abs=1e-7)
    else:
        assert_same(reference, shared, job)
    assert all(o.kv_bytes < reference[0].kv_bytes for o in shared[1:])
