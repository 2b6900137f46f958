"""The shared scoring engine equals the per-entry path on SmolLM2 (slow: loads the model)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("protocol", ["question-agnostic", "question-aware"])
def test_shared_engine_equals_per_entry_path_on_smollm2(protocol):
    from polykv_search import scoring
    from polykv_search.cli.baselines import baseline
    from polykv_search.evaluation.runner import eos_token_ids
    from polykv_search.models import load_model
    from polykv_search.runtime import apply_strategy, strategy_plans
    from polykv_search.scoring import per_entry
    from polykv_search.scoring.engine import sample_job
    from polykv_search.scoring.shared import SharedScorer
    from strategies import Strategy

    model, tok = load_model()
    L = model.config.num_hidden_layers
    entries = [baseline(spec, L, 64) for spec in ("full", "uniform:snapkv", "uniform:h2o", "uniform:tova", "pyramid")]
    mixed = Strategy.from_choices(
        [("snapkv", 96), ("h2o", 32), ("streaming_llm", 64)] * (L // 3),
        [("tova", 64), ("h2o", 64), ("snapkv", 64)] * (L // 3),
        64.0,
    )
    entries.append(scoring.Entry("mixed", mixed, "strategy", "mixed"))
    texts, _ = scoring.eval_texts("austen")
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, texts, n_samples=1, context_len=512, seed=0)
    for task, (sample,) in samples.values():
        job = sample_job(tok, task, sample, frozenset(eos_token_ids(model, tok)), None, protocol)
        assert bool(job.question_ids) == (protocol == "question-agnostic" and not job.teacher_forced)
        reference = per_entry.run_sample(model, entries, job)
        with apply_strategy(model, Strategy.full(L)) as rt:
            shared = SharedScorer(model, rt, [strategy_plans(e.strategy) for e in entries]).run(job)
        for ref, got in zip(reference, shared):
            assert got.kv_bytes == ref.kv_bytes
            if job.teacher_forced:
                torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-4)
                assert got.pred["correct"] == ref.pred["correct"]
                assert got.pred["kl"] == pytest.approx(ref.pred["kl"], abs=1e-5)
            else:
                assert got.new_ids == ref.new_ids


def test_head_group_strategies_score_alike_on_both_engines_on_smollm2():
    """The study's duo and head-level ilp strategies (head groups in every layer) beside uniform snapkv."""
    from pathlib import Path

    from polykv_search import scoring
    from polykv_search.cli.baselines import baseline
    from polykv_search.models import load_model
    from strategies import Strategy

    model, tok = load_model()
    study = Path(__file__).resolve().parents[1] / "studies" / "kvzip"
    entries = [baseline("uniform:snapkv", model.config.num_hidden_layers, 256)]
    entries += [scoring.Entry(n, Strategy.load(study / f"{n}.json"), "strategy", n) for n in ("duo", "ilp-head")]
    texts, _ = scoring.eval_texts("austen")
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_multikey")
    samples = scoring.make_task_samples(tok, tasks, texts, n_samples=1, context_len=1024, seed=0)
    shared = scoring.score_entries(model, tok, entries, samples, engine="shared")
    per = scoring.score_entries(model, tok, entries, samples, engine="per-entry")
    for a, b in zip(shared, per):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
        kl_a, kl_b = a["extra"]["broad/continuation"]["kl"], b["extra"]["broad/continuation"]["kl"]
        assert kl_a == pytest.approx(kl_b, abs=1e-5)
