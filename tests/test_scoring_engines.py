"""The shared scoring engine (one FullKV context pass per sample, entries batched) equals the per-entry
path: same kept tokens, predictions, scores and KV bytes; logits allclose in fp32."""

from __future__ import annotations

import pytest
import torch

from polykv_search import scoring
from polykv_search.patterns import PATTERNS
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.scoring import per_entry
from polykv_search.scoring.job import SampleJob
from polykv_search.scoring.shared import SharedScorer, plan_groups
from strategies import Strategy
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.tiny import FAMILIES, tiny_model

L = 3
EVICTING = [p for p in PATTERNS if p != "full"]


def entries(budget: int = 24) -> list[scoring.Entry]:
    """FullKV, every pattern uniform (both phases), and strategies mixing patterns, budgets and phases."""
    out = [scoring.Entry("full", Strategy.full(L), "baseline", "full")]
    out += [scoring.Entry(f"uniform-{p}", Strategy.uniform(L, p, budget), "baseline", p) for p in EVICTING]
    mixed = Strategy.from_choices(
        [("snapkv", budget + 8), ("h2o", budget), ("tova", budget - 8)],
        [("h2o", budget + 4), ("streaming_llm", budget), ("snapkv", budget - 4)],
        float(budget),
    )
    prefill_only = Strategy.from_choices([("snapkv", budget)] * L, [("full", None)] * L, None)
    decoding_only = Strategy.from_choices([("full", None)] * L, [("h2o", budget)] * L, None)
    same_pattern_other_budget = Strategy.uniform(L, "snapkv", budget // 2)
    out += [
        scoring.Entry("mixed", mixed, "strategy", "mixed"),
        scoring.Entry("prefill-only", prefill_only, "strategy", "p"),
        scoring.Entry("decoding-only", decoding_only, "strategy", "d"),
        scoring.Entry("snapkv-half", same_pattern_other_budget, "strategy", "s"),
    ]
    return out


def jobs(tok, n: int = 90):
    ids = tok(haystack_texts()[3][: n + 40], add_special_tokens=True)["input_ids"]
    forced = SampleJob("teacher_forced", ids[:n], [], target_ids=ids[n : n + 12])
    gen = SampleJob("generate", ids[:n], ids[n : n + 7], limit=9)
    return forced, gen


def run_both(model, es, job, *, batch_entries=16, decode_interval=1, split=None):
    reference = per_entry.run_sample(model, es, job, decode_interval=decode_interval)
    with apply_strategy(model, Strategy.full(L), decode_interval=decode_interval) as rt:
        plans = [strategy_plans(e.strategy) for e in es]
        scorer = SharedScorer(model, rt, plans, batch_entries=batch_entries, split=split)
        shared = scorer.run(job)
    return reference, shared


def assert_same(reference, shared, job):
    for ref, got in zip(reference, shared):
        assert got.kv_bytes == ref.kv_bytes and got.full_kv_bytes == ref.full_kv_bytes
        if job.teacher_forced:
            torch.testing.assert_close(got.logits, ref.logits, rtol=1e-5, atol=1e-5)
            assert got.pred["correct"] == ref.pred["correct"]
            assert got.pred["nll"] == pytest.approx(ref.pred["nll"], rel=1e-5)
            assert got.pred["kl"] == pytest.approx(ref.pred["kl"], abs=1e-6)
            assert got.pred["dnll"] == pytest.approx(ref.pred["dnll"], abs=1e-5)
        else:
            assert got.new_ids == ref.new_ids


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_shared_engine_equals_per_entry_path_for_every_pattern_and_phase(family, kind):
    model, tok = tiny_model(family), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    es = entries()
    reference, shared = run_both(model, es, job)
    assert_same(reference, shared, job)
    if job.teacher_forced:  # FullKV has no KL; a compressed prompt has (the continuation is one call, so a
        # decoding-only strategy never evicts before it is scored)
        assert reference[0].pred["kl"] == 0.0 and shared[0].pred["kl"] == 0.0
        assert all((o.pred["kl"] > 0) == (e.name != "decoding-only") for e, o in zip(es[1:], shared[1:]))
    else:
        assert len({tuple(o.new_ids) for o in shared}) > 1


@pytest.mark.parametrize("interval", [1, 3])
def test_batching_and_decode_interval_do_not_change_results(interval):
    model, tok = tiny_model("llama"), char_tokenizer()
    _, gen = jobs(tok)
    es = entries()
    reference, batched = run_both(model, es, gen, batch_entries=16, decode_interval=interval)
    _, one_by_one = run_both(model, es, gen, batch_entries=1, decode_interval=interval)
    assert_same(reference, batched, gen)
    assert_same(reference, one_by_one, gen)


def test_rows_that_emit_eos_leave_the_batch_and_stop_like_the_reference():
    model, tok = tiny_model("llama"), char_tokenizer()
    _, gen = jobs(tok)
    es = entries()
    free, _ = run_both(model, es, gen)
    # make a token that some rows emit mid-way (and others never) the EOS token
    counts = {}
    for o in free:
        for t in set(o.new_ids[1:]):
            counts[t] = counts.get(t, 0) + 1
    eos = min(counts, key=lambda t: (abs(counts[t] - len(es) / 2), t))
    job = SampleJob("generate", gen.context_ids, gen.question_ids, limit=gen.limit, eos=frozenset({eos}))
    reference, shared = run_both(model, es, job)
    assert_same(reference, shared, job)
    lengths = {len(o.new_ids) for o in shared}
    assert len(lengths) > 1 and max(lengths) <= gen.limit  # some rows stopped early, others ran on
    assert all(eos not in o.new_ids for o in shared)


def test_score_entries_shared_equals_per_entry_on_tasks():
    model, tok = tiny_model("qwen3"), char_tokenizer()
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=300, seed=0)
    es = entries(32)[:6]
    shared = scoring.score_entries(model, tok, es, samples, engine="shared", max_new_tokens=6)
    per = scoring.score_entries(model, tok, es, samples, engine="per-entry", max_new_tokens=6)
    for a, b in zip(shared, per):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
        for task in a["tasks"]:
            pa, pb = a["tasks"][task]["per_sample"], b["tasks"][task]["per_sample"]
            assert [r["prediction"] if task != "broad/continuation" else r["score"] for r in pa] == [
                r["prediction"] if task != "broad/continuation" else r["score"] for r in pb
            ]
        assert a["extra"]["broad/continuation"]["kl"] == pytest.approx(b["extra"]["broad/continuation"]["kl"], abs=1e-6)
        assert a["seconds"] is None and b["seconds"] > 0
    assert shared[0]["extra"]["broad/continuation"]["kl"] == 0.0
    assert all(r["kl"] >= 0 and "dnll" in r for r in shared[1]["tasks"]["broad/continuation"]["per_sample"])


def test_plan_groups_pads_cheap_rows_together_and_keeps_long_rows_apart():
    short, long = [4, 4, 4], [400, 400, 400]
    assert plan_groups([short, short, long, short], max_rows=8, fixed_cost=100) == [[0, 1, 3], [2]]
    assert plan_groups([short, short, long], max_rows=8, fixed_cost=10_000) == [[0, 1, 2]]  # weights dominate
    assert plan_groups([short] * 5, max_rows=2, fixed_cost=100) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="max_rows"):
        plan_groups([short], max_rows=0, fixed_cost=1)


def test_unknown_engine_is_a_score_error():
    model, tok = tiny_model("llama"), char_tokenizer()
    with pytest.raises(scoring.ScoreError, match="engine"):
        scoring.score_entries(model, tok, entries()[:1], {}, engine="fast")


def test_entries_that_apply_one_strategy_run_as_one_row_with_the_reference_results(monkeypatch):
    import polykv_search.scoring.engine as engine

    model, tok = tiny_model("qwen3"), char_tokenizer()
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=300, seed=0)
    es = entries(32)[:3] + [
        scoring.Entry("ilp", Strategy.uniform(L, "h2o", 40), "strategy", "ilp.json"),
        scoring.Entry("dp", Strategy.uniform(L, "h2o", 40), "strategy", "dp.json"),  # another object, equal plans
        scoring.Entry("again-full", Strategy.full(L), "strategy", "f.json"),
    ]
    rows = []
    real = engine.SharedScorer

    def counting(model, runtime, plans, **kw):
        rows.append(len(plans))
        return real(model, runtime, plans, **kw)

    monkeypatch.setattr(engine, "SharedScorer", counting)
    shared = scoring.score_entries(model, tok, es, samples, engine="shared", max_new_tokens=6)
    per = scoring.score_entries(model, tok, es, samples, engine="per-entry", max_new_tokens=6)
    assert rows == [4]  # full, two uniforms, h2o@40: the twins ran as their first's row
    for a, b in zip(shared, per):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
        pa, pb = a["tasks"]["ruler/niah_single"]["per_sample"], b["tasks"]["ruler/niah_single"]["per_sample"]
        assert [r["prediction"] for r in pa] == [r["prediction"] for r in pb]
        assert a["extra"]["broad/continuation"]["kl"] == pytest.approx(b["extra"]["broad/continuation"]["kl"], abs=1e-6)
    assert shared[4]["tasks"] == shared[3]["tasks"] and shared[4]["name"] == "dp"
    assert shared[5]["extra"]["broad/continuation"]["kl"] == 0.0  # FullKV's twin: no divergence


def test_same_runs_maps_each_entry_to_the_first_equal_one():
    from polykv_search.scoring.engine import same_runs

    runs, distinct = same_runs(["a", "b", "a", "c", "b"])
    assert distinct == [0, 1, 3]
    assert runs == [(0, True), (1, True), (0, False), (2, True), (1, False)]
