"""quickstart's ``--jobs``: collect and score fan out over local processes, one per CPU core by default."""

from __future__ import annotations

import pytest

from polykv_search import parallel
from polykv_search.cli import build_parser
from tests.test_quickstart_heads import planned, value


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    monkeypatch.setattr(parallel, "available_memory", lambda: 24 * 2**30)


def test_by_default_collect_and_score_run_one_worker_per_core(tmp_path, monkeypatch, two_cores):
    calls = planned(tmp_path, monkeypatch)
    layer_collect = next(c for c in calls if c[0] == "collect" and "--head-cells" not in c)
    assert value(layer_collect, "--jobs") == "2"
    assert value(calls[-1], "--jobs") == "2" and calls[-1][0] == "score"
    heads = next(c for c in calls if "--head-cells" in c)
    assert "--jobs" not in heads  # the head cells run in this process (measured faster on 2 cores)


def test_one_job_runs_every_step_in_this_process(tmp_path, monkeypatch, two_cores):
    assert not any("--jobs" in c for c in planned(tmp_path, monkeypatch, "--jobs", "1"))


def test_a_count_the_machine_holds_is_passed_on_as_given(tmp_path, monkeypatch, two_cores):
    assert value(planned(tmp_path, monkeypatch, "--jobs", "2")[-1], "--jobs") == "2"


def test_a_count_above_the_cores_is_clamped_with_a_notice_before_any_step(tmp_path, monkeypatch, two_cores, capsys):
    assert value(planned(tmp_path, monkeypatch, "--jobs", "100000")[-1], "--jobs") == "2"
    assert "note: --jobs 100000 clamped to 2, the most worker processes this machine holds" in capsys.readouterr().err


def test_auto_is_one_per_core_on_a_cpu_up_to_the_cap_and_one_on_an_accelerator(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 16)
    monkeypatch.setattr(parallel, "available_memory", lambda: 64 * 2**30)
    assert parallel.auto_jobs("cpu") == parallel.AUTO_JOBS_CAP == 4
    assert parallel.auto_jobs("cuda") == parallel.auto_jobs("cuda:1") == parallel.auto_jobs("mps") == 1
    monkeypatch.setattr(parallel, "usable_cores", lambda: 1)
    assert parallel.auto_jobs("cpu") == 1


def test_auto_starts_no_more_workers_than_the_memory_holds(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 8)
    monkeypatch.setattr(parallel, "available_memory", lambda: 9 * 2**30)
    assert parallel.auto_jobs("cpu") == 2  # 4 GiB each
    monkeypatch.setattr(parallel, "available_memory", lambda: 3 * 2**30)
    assert parallel.auto_jobs("cpu") == 1  # never fewer than one
    monkeypatch.setattr(parallel, "available_memory", lambda: None)  # unknown: the cores and the cap decide
    assert parallel.auto_jobs("cpu") == 4


def test_an_explicit_count_is_capped_by_the_cores_and_memory_as_auto_is_but_never_below_two(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 8)
    monkeypatch.setattr(parallel, "available_memory", lambda: 13 * 2**30)
    from polykv_search.cli.limits import MIN_JOBS_LIMIT, jobs_limit

    assert jobs_limit()[0] == 3  # 4 GiB a worker
    monkeypatch.setattr(parallel, "available_memory", lambda: 2**30)
    assert jobs_limit()[0] == MIN_JOBS_LIMIT == 2  # a fan-out needs two
    monkeypatch.setattr(parallel, "available_memory", lambda: None)
    most, why = jobs_limit()
    assert most == 8 and why == "8 usable CPU cores"


def test_the_available_memory_is_read_from_this_machine():
    memory = parallel.available_memory()
    assert memory is None or memory > 2**28


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_a_bad_count_is_a_one_line_usage_error(tmp_path, bad):
    from polykv_search.cli import UsageError

    with pytest.raises(UsageError) as err:
        build_parser().parse_args(["quickstart", "--out", str(tmp_path / "qs"), "--jobs", bad])
    assert "--jobs" in str(err.value) and "or auto" in str(err.value) and "\n" not in str(err.value)


def test_the_report_says_how_the_scoring_ran():
    from polykv_search.cli.quickstart_report import _step_times

    timings = {"1/4 collect": 120.4, "3/4 score": 800.2}
    fanned = _step_times(timings, {"jobs": 2, "backend": "loky", "threads": 1})
    assert fanned == "Step times: 1/4 collect 120s, 3/4 score 800s (score: 2 loky workers, 1 thread(s) each)"
    assert _step_times(timings, {"jobs": 1, "backend": "in-process", "threads": 2}).endswith("score 800s")
    assert _step_times({}, {"jobs": 2}) == "All steps reused."


@pytest.mark.parametrize("command", ["score", "collect"])
def test_score_and_collect_take_auto_too(command, monkeypatch, two_cores):
    import argparse

    from polykv_search.cli.common import resolve_jobs

    args = build_parser().parse_args([command, "--jobs", "auto", "--out", "x.json"])
    assert args.jobs == "auto"
    assert resolve_jobs(args) == args.jobs == 2
    assert resolve_jobs(argparse.Namespace(jobs="auto", device="cuda")) == 1
    assert resolve_jobs(argparse.Namespace(jobs=2, device="cpu")) == 2
    assert resolve_jobs(argparse.Namespace(jobs=3, device="cpu")) == 2  # clamped to the cores, with a notice
    assert resolve_jobs(argparse.Namespace(jobs=3, device="cpu", address="tcp://h:1")) == 3  # a cluster's own
