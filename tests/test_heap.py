"""Freed heap memory goes back to the system after every scored sample (glibc ``malloc_trim``)."""

from __future__ import annotations

import sys

import pytest

import polykv_search.scoring.engine as engine
from polykv_search import heap, scoring
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.test_scoring_engines import entries
from tests.tiny import tiny_model


def test_on_linux_with_glibc_the_trim_is_called():
    if not sys.platform.startswith("linux") or heap._malloc_trim() is None:
        pytest.skip("no glibc malloc_trim here")
    assert heap.release_free_memory() is True


def test_without_a_trim_call_it_is_a_no_op(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.release_free_memory() is False


@pytest.mark.parametrize("engine_name", ["shared", "per-entry"])
def test_every_scored_sample_releases_the_free_heap_once(monkeypatch, engine_name):
    calls = []
    monkeypatch.setattr(engine, "release_free_memory", lambda: calls.append(1) or True)
    model, tok = tiny_model("llama"), char_tokenizer()
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=300, seed=0)
    scoring.score_entries(model, tok, entries(24)[:3], samples, engine=engine_name, max_new_tokens=3)
    assert len(calls) == 4  # 2 tasks x 2 samples, whatever the number of entries
