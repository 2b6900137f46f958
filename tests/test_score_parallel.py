"""``score --jobs``: samples fanned out over joblib workers (in-process, loky processes, a local dask
cluster) give the one-process results but for wall times, and a stopped distributed run resumes."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from polykv_search import scoring
from polykv_search.parallel import ModelLoader
from polykv_search.scoring.checkpoint import Checkpoint
from polykv_search.scoring.parallel import FanOut
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.test_score_resume import without_times
from tests.test_scoring_engines import entries
from tests.tiny import tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A saved tiny checkpoint (workers load it by path), its model and tokenizer, and 2 tasks x 3 samples."""
    path = tmp_path_factory.mktemp("tiny-qwen3")
    model, tok = tiny_model("qwen3"), char_tokenizer()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    tasks = scoring.resolve_tasks("broad/continuation,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=3, context_len=300, seed=0)
    return path, model, tok, samples


def _score(tiny, **kw):
    path, model, tok, samples = tiny
    return scoring.score_entries(model, tok, entries(32)[:5], samples, max_new_tokens=5, **kw)


@pytest.fixture(scope="module")
def reference(tiny):
    """The one-process results every fanned-out run is held to."""
    return _score(tiny)


@pytest.mark.parametrize(("backend", "jobs"), [("sequential", 1), ("loky", 2), ("dask", 2)])
def test_fanned_out_samples_give_the_one_process_results(tiny, reference, backend, jobs):
    if backend == "dask":
        pytest.importorskip("dask.distributed")
    seen = []
    fanned = _score(tiny, fan_out=FanOut(ModelLoader(str(tiny[0])), jobs, backend), progress=seen.append)
    assert without_times(fanned) == without_times(reference)
    assert sum(seen) == 5 * 6  # every (entry, sample) once


def test_a_stopped_fanned_out_run_resumes_from_its_checkpoint(tiny, reference, tmp_path):
    checkpoint = Checkpoint.open(tmp_path / "r.json.partial", "run", entries=5)
    first = {}

    def stop_after_two(entries_, settings, pending, record):
        for task, index, sample in pending[:2]:
            with scoring.engine.SampleRunner(tiny[1], tiny[2], entries_, settings) as runner:
                record(task, index, sample, {"rows": runner.run(task, sample), "wall": 1.0})
            first[(task.name, index)] = True
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _score(tiny, fan_out=stop_after_two, checkpoint=checkpoint)
    again = Checkpoint.open(tmp_path / "r.json.partial", "run", entries=5)
    assert set(again.done) == set(first)
    ran = []

    def count(entries_, settings, pending, record):
        ran.extend((t.name, i) for t, i, _ in pending)
        FanOut(ModelLoader(str(tiny[0])), 1, "sequential")(entries_, settings, pending, record)

    resumed = _score(tiny, fan_out=count, checkpoint=again)
    assert len(ran) == 4 and not set(ran) & set(first)  # only the samples the stopped run had not finished
    assert without_times(resumed) == without_times(reference)


def test_workers_get_the_costliest_samples_first_and_the_results_stay_in_task_order(tiny, reference):
    in_task_order = [(task.name, i) for task, samples in tiny[3].values() for i in range(len(samples))]
    work = {key: float(n) for n, key in enumerate(in_task_order)}  # the later, the costlier
    given = []

    def record_order(entries_, settings, pending, record):
        given.extend((t.name, i) for t, i, _ in pending)
        FanOut(ModelLoader(str(tiny[0])), 1, "sequential")(entries_, settings, pending, record)

    fanned = _score(tiny, fan_out=record_order, work=work)
    assert given == in_task_order[::-1]
    assert without_times(fanned) == without_times(reference)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--backend", "loky"], "give --jobs 2 or more"),
        (["--address", "tcp://x:1"], "applies to --backend dask or ray"),
        (["--backend", "loky", "--jobs", "2", "--address", "tcp://x:1"], "does not apply to --backend loky"),
    ],
)
def test_bad_fan_out_flags_are_one_line_exit_2(tmp_path, capsys, flags, message):
    from polykv_search.cli import main

    argv = ["score", "--baseline", "full", "--out", str(tmp_path / "r.json"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("jobs", "backend", "expected"),
    [
        (2, None, {"jobs": 2, "backend": "loky", "threads": max(1, (os.cpu_count() or 1) // 2)}),
        (4, "dask", {"jobs": 4, "backend": "dask", "threads": None}),
        (1, "sequential", {"jobs": 1, "backend": "sequential", "threads": "now"}),
    ],
)
def test_the_results_file_records_how_the_run_was_executed(jobs, backend, expected):
    from polykv_search.cli.score import _execution

    if expected["threads"] == "now":  # the torch threads when the run starts (another test may have set them)
        expected = {**expected, "threads": torch.get_num_threads()}
    assert _execution(argparse.Namespace(jobs=jobs, backend=backend)) == expected
