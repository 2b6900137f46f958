"""`polykv-search score` resumes a stopped run from ``<out>.partial``: the samples it finished are
replayed, not run again, and the results file is the uninterrupted run's (but for wall times)."""

from __future__ import annotations

import json

import pytest

from polykv_search.cli import main
from polykv_search.scoring import ScoreError, engine
from polykv_search.scoring.checkpoint import Checkpoint
from tests.test_score_cli import checkpoint, score, score_argv  # noqa: F401  (the tiny model fixture)

TIMES = {"timing", "seconds", "context_s", "question_s", "decode_s", "total_s", "created"}
SAMPLES = 6  # 3 per task, 2 tasks


def without_times(obj):
    """``obj`` with every wall-time field dropped (they differ between any two runs)."""
    if isinstance(obj, dict):
        return {k: without_times(v) for k, v in obj.items() if k not in TIMES}
    if isinstance(obj, list):
        return [without_times(v) for v in obj]
    return obj


@pytest.fixture
def counted(monkeypatch):
    """Counts the samples actually run; ``stop_after`` makes the run die like a killed process."""
    state = {"runs": 0, "stop_after": None}
    real = engine.sample_job

    def sample_job(*args, **kwargs):
        if state["stop_after"] is not None and state["runs"] == state["stop_after"]:
            raise KeyboardInterrupt
        state["runs"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "sample_job", sample_job)
    return state


def stop_after(checkpoint, out, counted, n: int, *extra: str) -> None:  # noqa: F811
    counted.update(runs=0, stop_after=n)
    assert main(score_argv(checkpoint, out, *extra)) == 130  # what an interrupt exits with
    counted.update(runs=0, stop_after=None)


def test_a_stopped_run_resumes_and_writes_the_uninterrupted_results(checkpoint, tmp_path, counted, capsys):  # noqa: F811
    whole = score(checkpoint, tmp_path / "whole.json")
    assert counted["runs"] == SAMPLES and not (tmp_path / "whole.json.partial").exists()
    out = tmp_path / "new" / "resumed.json"  # in a folder that does not exist yet
    stop_after(checkpoint, out, counted, 4)
    assert not out.exists()  # nothing half-written
    err = capsys.readouterr().err.splitlines()  # one line says where the finished samples are and how to resume
    stopped = [line for line in err if "finished samples kept in" in line]
    assert stopped == [f"interrupted: 4 finished samples kept in {out}.partial; the same command resumes from there"]
    assert err[-1] == stopped[0]
    lines = (tmp_path / "new" / "resumed.json.partial").read_text().splitlines()
    assert len(lines) == 1 + 4  # the key, then one line per finished sample
    resumed = score(checkpoint, out)
    assert counted["runs"] == SAMPLES - 4  # only the unfinished samples ran
    err = capsys.readouterr().err
    assert "resuming: 4 finished samples" in err and "18/18 entry×samples" in err  # 3 entries × 6 samples
    assert without_times(resumed) == without_times(whole)
    assert not (tmp_path / "new" / "resumed.json.partial").exists()


def test_a_line_cut_off_by_a_kill_is_dropped_and_that_sample_runs_again(checkpoint, tmp_path, counted):  # noqa: F811
    whole = score(checkpoint, tmp_path / "whole.json")
    out = tmp_path / "r.json"
    stop_after(checkpoint, out, counted, 2)
    partial = tmp_path / "r.json.partial"
    partial.write_text(partial.read_text() + '{"task": "ruler/niah_single", "index": 0, "rows": [{"rec')
    resumed = score(checkpoint, out)
    assert counted["runs"] == SAMPLES - 2
    assert without_times(resumed) == without_times(whole)


def test_the_partial_file_of_another_run_is_refused_with_one_line(checkpoint, tmp_path, counted, capsys):  # noqa: F811
    out = tmp_path / "r.json"
    stop_after(checkpoint, out, counted, 1, "--seed", "1")
    before = (tmp_path / "r.json.partial").read_text()
    capsys.readouterr()
    assert main(score_argv(checkpoint, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "r.json.partial" in err[0] and "delete it" in err[0]
    assert not out.exists() and (tmp_path / "r.json.partial").read_text() == before


def test_a_run_stopped_under_another_release_is_not_resumed(checkpoint, tmp_path, counted, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "r.json"
    stop_after(checkpoint, out, counted, 1)
    monkeypatch.setattr("polykv_search.__version__", "99.0")
    capsys.readouterr()
    assert main(score_argv(checkpoint, out)) == 2
    assert "code versions" in capsys.readouterr().err and not out.exists()


def test_a_checkpoint_refuses_a_different_sample_at_a_finished_index(tmp_path):
    cp = Checkpoint.open(tmp_path / "p", "k")
    cp.add("t", 0, "s0", [], 1.0)
    again = Checkpoint.open(tmp_path / "p", "k")
    assert again.get("t", 0, "s0")["wall"] == 1.0 and again.get("t", 1, "s1") is None
    with pytest.raises(ScoreError, match="not 'other'"):
        again.get("t", 0, "other")
    with pytest.raises(ScoreError, match="delete it"):
        Checkpoint.open(tmp_path / "p", "another key")
    assert json.loads((tmp_path / "p").read_text().splitlines()[0]) == {"key": "k"}


def test_a_file_cut_inside_its_first_line_holds_nothing_and_is_started_again(tmp_path):
    (tmp_path / "p").write_text('{"key": "k", "tas')
    cp = Checkpoint.open(tmp_path / "p", "k")
    assert cp.done == {} and not (tmp_path / "p").exists()
    cp.add("t", 0, "s0", [], 1.0)
    assert Checkpoint.open(tmp_path / "p", "k").get("t", 0, "s0")["wall"] == 1.0


def test_decode_batch_is_in_the_checkpoint_key_and_the_default_keeps_the_key_of_earlier_releases(tmp_path):
    """A run stopped under another --decode-batch is not resumed (its decode floats may differ in the last digits);
    one stopped at the default before decode_batch was recorded still is."""
    from polykv_search.cli.score_resume import DECODE_BATCH, open_checkpoint

    def key(**extra) -> str:
        settings = {"samples": 3, "context_len": 300, "seed": 0, **extra}
        return open_checkpoint(str(tmp_path / "r.json"), settings, "shared", "fp", [], {}, {}, "question-agnostic").key

    assert key(decode_batch=DECODE_BATCH) == key()
    assert key(decode_batch=2) != key()
