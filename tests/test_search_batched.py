"""The search's batched objective: every strategy of a round measured on a sample at once by the scoring engine
gives the values the one-at-a-time path (the reference) gives, resumes from either's journal, and measures
nothing twice.

The search's samples are a context and a continuation with no question, so the two protocols of the scoring
engine (question-agnostic and question-aware) are the same run here: there is no question to compress.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from test_retrieval_calibration import one_thread  # noqa: F401  (autouse: one intra-op thread)
from tiny import tiny_model

from polykv_search.scoring import Entry, per_entry
from polykv_search.scoring.job import SampleJob
from solvers import Problem
from solvers.search_loop import local_search
from solvers.search_objective import SearchJournal, WholeModelObjective
from solvers.search_space import SearchSpace
from solvers.uniform import UniformSettings, UniformSolver
from strategies import HeadGroup, LayerChoice, Strategy

L = 3
POOLED = {"allocation": "model", "n_sink": 2}
KEY = {"model": "tiny", "model_fingerprint": "x", "samples": {"n": 3}, "definition": "v1"}


def grouped(*groups) -> LayerChoice:
    return LayerChoice.grouped(HeadGroup(*g) for g in groups)


def layer_level() -> list[Strategy]:
    """Uniform and mixed layer-level strategies, a kvzip[allocation=model] pool among them; every one evicts
    while decoding (budgets below the 48-token context)."""
    pool = [LayerChoice("kvzip", b, POOLED) for b in (12, 20, 16)]
    mixed = [LayerChoice("snapkv", 20), LayerChoice("tova", 12), LayerChoice("kvzip", 16, POOLED)]
    return [
        Strategy.uniform(L, "kvzip", 16, params=POOLED),
        Strategy(pool, pool, 16.0, 4),
        Strategy.uniform(L, "snapkv", 16),
        Strategy(mixed, [LayerChoice("h2o", 16)] * L, 16.0, 4),
        Strategy.uniform(L, "streaming_llm", 12, params={"n_sink": 2}),
    ]


def head_level() -> list[Strategy]:
    """Head groups (tiny models: 2 KV heads): a keep-all head beside streaming or pooled kvzip heads, pooled
    kvzip single-head groups at different budgets, and a layer-level row beside them."""
    duo = grouped(((0,), "full", 4096), ((1,), "streaming_llm", 10, {"n_sink": 2}))
    pooled = [
        grouped(((0,), "full", 4096), ((1,), "kvzip", 14, POOLED)),
        grouped(((0,), "kvzip", 10, POOLED), ((1,), "kvzip", 20, POOLED)),
        grouped(((0,), "snapkv", 12), ((1,), "kvzip", 18, POOLED)),
    ]
    kw = dict(global_budget=None, context_len=4096, num_kv_heads=2)
    return [
        Strategy([duo] * L, [duo] * L, **kw),
        Strategy(pooled, pooled, **kw),
        Strategy([duo, pooled[2], LayerChoice("tova", 16)], [duo, pooled[2], LayerChoice("tova", 16)], **kw),
        Strategy.uniform(L, "kvzip", 16, params=POOLED),
    ]


def samples(seed: int = 5, n: int = 3) -> list:
    g = torch.Generator().manual_seed(seed)
    return [
        types.SimpleNamespace(
            context_ids=torch.randint(10, 128, (48,), generator=g).tolist(),
            continuation_ids=torch.randint(10, 128, (8,), generator=g).tolist(),
            scored=(2, 7) if i % 2 else None,
        )
        for i in range(n)
    ]


def objective(model, sams, *, batched: bool, journal: SearchJournal | None = None, batch_entries: int = 16):
    journal = journal or SearchJournal.open(None, KEY)
    return WholeModelObjective(model, sams, journal, batched=batched, batch_entries=batch_entries)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("shape", ["layer", "head"])
def test_a_batched_round_gives_the_one_at_a_time_values(family, shape):
    """Two rounds (the starts, then neighbours): the second reuses each sample's FullKV reference."""
    model, sams = tiny_model(family, layers=L), samples()
    strategies = layer_level() if shape == "layer" else head_level()
    rounds = [strategies[:2], strategies[2:]]
    naive, batched = objective(model, sams, batched=False), objective(model, sams, batched=True, batch_entries=3)
    for strategies in rounds:
        want, got = naive(strategies), batched(strategies)
        assert want.shape == got.shape == (len(sams), len(strategies)) and (want > 1e-4).all()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-7)
    assert batched.fullkv_runs == naive.fullkv_runs == len(sams)  # one reference per sample, in the first round
    assert batched.batches == len(sams) * len(rounds) and batched.runs == naive.runs
    assert batched.forward_calls < naive.forward_calls


def test_a_strategy_given_twice_or_journaled_is_measured_once():
    model, sams = tiny_model("llama", layers=L), samples()
    a, b = layer_level()[:2]
    batched = objective(model, sams, batched=True)
    first = batched([a, b, a])
    assert batched.runs == 2 * len(sams) and batched.cached == len(sams)
    np.testing.assert_array_equal(first[:, 0], first[:, 2])
    again = batched([b, a])
    assert batched.runs == 2 * len(sams) and batched.batches == len(sams)  # nothing run for a journaled round
    np.testing.assert_array_equal(again, first[:, [1, 0]])


def test_either_path_resumes_the_others_journal_without_running_anything(tmp_path):
    p = Problem(global_budget=16, num_layers=L, patterns=["snapkv", "tova"], b_min=4, phases=["prefill"])
    starts = [(n, UniformSolver(UniformSettings(pattern=n)).solve(p).strategy) for n in ("snapkv", "tova")]
    model, sams = tiny_model("llama", layers=L), samples()

    def search(batched: bool, journal: SearchJournal):
        obj = objective(model, sams, batched=batched, journal=journal)
        space = lambda start: SearchSpace(p, start, blocks=2, step=4, patterns=p.patterns)  # noqa: E731
        return local_search(starts, space, obj, obj.kinds, max_evaluations=5), obj

    path = tmp_path / "s.journal"
    naive, _ = search(False, SearchJournal.open(path, KEY))
    batched, obj = search(True, SearchJournal.open(path, KEY))
    assert obj.runs == 0 and obj.cached == naive.evaluated * len(sams)
    assert batched.result.digest() == naive.result.digest()
    np.testing.assert_array_equal(batched.values, naive.values)
    fresh, _ = search(True, SearchJournal.open(None, KEY))  # the same path, measured batched from scratch
    assert fresh.result.digest() == naive.result.digest() and fresh.evaluated == naive.evaluated
    np.testing.assert_allclose(fresh.values, naive.values, rtol=1e-4, atol=5e-7)


@pytest.mark.parametrize("shape", ["layer", "head"])
def test_stepwise_teacher_forcing_is_the_same_on_both_engines(shape):
    """``SampleJob(stepwise=True)`` (the continuation one token per call, as the search measures it) on the
    shared engine and on the per-entry path."""
    from polykv_search.runtime import apply_strategy
    from polykv_search.scoring import shared_scorer

    model, sample = tiny_model("qwen3", layers=L), samples()[1]
    strategies = layer_level() if shape == "layer" else head_level()
    job = SampleJob("teacher_forced", sample.context_ids, [], target_ids=sample.continuation_ids, stepwise=True)
    entries = [Entry(f"e{i}", s, "strategy", f"e{i}") for i, s in enumerate(strategies)]
    reference = per_entry.run_sample(model, entries, job)
    with apply_strategy(model, Strategy.full(L)) as runtime:
        scorer, runs = shared_scorer(model, runtime, strategies, batch_entries=2)
        outcomes = scorer.run(job)
    one_call = per_entry.run_sample(model, entries, SampleJob(**{**vars(job), "stepwise": False}))
    for (k, _), want, once in zip(runs, reference, one_call):
        got = outcomes[k]
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
        assert got.pred["kl"] == pytest.approx(want.pred["kl"], rel=1e-4, abs=1e-8)
        assert got.kv_bytes == want.kv_bytes and got.pred["correct"] == want.pred["correct"]
        assert not torch.allclose(once.logits, want.logits, atol=1e-4)  # a decoding eviction changed them
