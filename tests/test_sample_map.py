"""``collect --jobs`` for the per-KV-head cells: samples fanned out over worker processes give the cells the
in-process measurement gives (a worker loads the model by path, once)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from polykv_search.models import load_model
from polykv_search.parallel import ModelLoader, worker_threads
from signals.head_cells import measure_head_cells
from signals.head_prefill_measure import measure_prefill_cells
from signals.sample_map import SampleMap
from tests.test_eval_support import char_tokenizer
from tests.tiny import tiny_model

PATTERNS = ["h2o", "kvzip[allocation=model]"]


def random_sample(seed: int, n: int, m: int, scored=None):
    """Random token ids: ``n`` of context, ``m`` of continuation, ``scored`` its answer span (all of it)."""
    ids = torch.randint(1, 90, (n + m,), generator=torch.Generator().manual_seed(seed)).tolist()
    return SimpleNamespace(context_ids=ids[:n], continuation_ids=ids[n:], scored=scored or (0, m))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny checkpoint on disk (workers load it by path), the same model loaded here, and the samples."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", layers=2, seed=7).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    model, _ = load_model(str(path))
    evidence = [random_sample(s, 30, 10, (4, 8)) for s in (1, 2, 3)]
    prose = [random_sample(s, 30, 10) for s in (9, 10)]
    return str(path), model, evidence, prose


def measure(model, evidence, prose, map_samples=None):
    seen = []
    streaming = measure_head_cells(
        model, evidence, prose, budgets=(6, 12), sink=2, on_sample=lambda: seen.append(1), map_samples=map_samples
    )
    prefill = measure_prefill_cells(
        model, evidence, prose, PATTERNS, budgets=(8, 20), on_sample=lambda: seen.append(1), map_samples=map_samples
    )
    return streaming, prefill, len(seen)


@pytest.mark.parametrize(("backend", "jobs"), [("sequential", 1), (None, 2)])
def test_fanned_out_cells_equal_the_in_process_ones(saved, backend, jobs):
    """The in-process reference runs with the workers' intra-op thread count: a matmul's rounding follows its
    thread count (1 thread against 2 moved these KLs by 3e-5 relative), and pytest's own count is whatever
    ``-n`` left it (conftest gives each xdist worker its share of the cores)."""
    path, model, evidence, prose = saved
    torch.set_num_threads(worker_threads(backend, jobs) or torch.get_num_threads())
    here, here_prefill, here_seen = measure(model, evidence, prose)
    fan = SampleMap(model, ModelLoader(path), jobs, backend)
    assert not fan.local
    there, there_prefill, there_seen = measure(model, evidence, prose, fan)
    assert here_seen == there_seen == 10  # every sample once per measurement
    for a, b in ((here, there), *zip(here_prefill, there_prefill)):
        for field in ("kl_answer_mean", "kl_answer_se", "kl_prose_mean", "kl_prose_se"):
            np.testing.assert_allclose(getattr(b, field), getattr(a, field), rtol=1e-6, atol=1e-9)
        assert (a.kl_answer_mean > 0).any()
    assert [c.pattern for c in there_prefill] == ["h2o", "kvzip"] and there_prefill[1].params == {"allocation": "model"}
    assert all(c.provenance["seconds"] > 0 for c in there_prefill)


def test_without_workers_a_map_runs_here_in_order():
    calls = []
    run = SampleMap("the model")
    assert run.local
    assert run(lambda model, s, k: (model, s * k), [1, 2, 3], 10, on_sample=lambda: calls.append(1)) == [
        ("the model", 10),
        ("the model", 20),
        ("the model", 30),
    ]
    assert len(calls) == 3
