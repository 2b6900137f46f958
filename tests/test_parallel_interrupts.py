"""Ctrl-C and kills with local workers (``--jobs N``, loky): Ctrl-C is one line and exit 130, and a parent
killed outright takes its worker processes and loky's resource trackers with it within seconds.

A stand-in workload (joblib tasks that sleep behind :func:`polykv_search.parallel.joblib_backend`) checks the
mechanism in seconds; ``score --jobs 2`` and ``collect --jobs 2`` on a tiny saved checkpoint check the commands.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.models_support import saved_tiny_checkpoint

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals and /proc")

ROOT = Path(__file__).resolve().parents[1]
#: seconds a process may outlive its killed parent ("a few seconds"; a worker checks every 0.25 s)
GRACE = 5.0

#: joblib tasks over 2 loky workers: the first two report at once, the rest sleep far past any test
STAND_IN = """
import os, sys, time
from joblib import Parallel, delayed
from polykv_search.parallel import joblib_backend

def task(i):
    time.sleep(600 if i >= 40 else 0.1)
    return os.getpid()

try:
    with joblib_backend("loky", None, 2):
        seen = set()
        for pid in Parallel(n_jobs=2, return_as="generator")(delayed(task)(i) for i in range(42)):
            if pid not in seen and len(seen) == 1:  # both workers started (one still importing dies in a traceback)
                print("ready", flush=True)
            seen.add(pid)
except KeyboardInterrupt:
    sys.stderr.write("interrupted\\n")
    sys.exit(130)
"""


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    """``argv`` in its own session (so a signal can reach its whole group, as Ctrl-C at a terminal does), with
    Python's SIGINT handler in place even where the test runner was started with SIGINT ignored."""
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {p for p in found if _running(p)}


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def _assert_all_end_after_kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``; every process below it (workers, resource trackers) ends within :data:`GRACE`."""
    below = _descendants(proc.pid)
    assert len(below) >= 3, below  # two workers and loky's resource tracker at least
    proc.kill()
    proc.wait(timeout=30)
    try:
        _wait_until(lambda: not any(_running(p) for p in below), GRACE, "the killed parent's workers to end")
    finally:
        for pid in below:  # whatever outlived the parent must not outlive the test
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    proc.stdout.close()
    proc.stderr.close()


def test_a_killed_parents_sleeping_and_idle_workers_and_trackers_end_within_seconds(tmp_path):
    proc = _start([sys.executable, "-c", STAND_IN], tmp_path)
    assert proc.stdout.readline() == b"ready\n", proc.stderr.read().decode()
    _assert_all_end_after_kill(proc)


def test_ctrl_c_to_the_whole_group_is_the_parents_alone(tmp_path):
    """The workers ignore Ctrl-C: the parent stops them, and nothing but its own line is printed."""
    proc = _start([sys.executable, "-c", STAND_IN], tmp_path)
    assert proc.stdout.readline() == b"ready\n", proc.stderr.read().decode()
    below = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.decode(), out) == (130, "interrupted\n", b"")
    _wait_until(lambda: not any(_running(p) for p in below), GRACE, "the workers to end")


# --------------------------------------------------------------------------------------------------------------
# The commands, on a tiny saved checkpoint: stopped once their first unit of work is on disk


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return saved_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"))


def _command(name: str, checkpoint, out: Path) -> tuple[list[str], Path]:
    """``name --jobs 2`` with far more work than a test waits for, and the file its first finished unit lands in."""
    model, corpus = map(str, checkpoint)
    if name == "score":
        argv = ["score", "--model", model, "--corpus", str(corpus), "--baseline", "full", "--baseline"]
        argv += ["uniform:snapkv", "--budget", "16", "--suite", "broad/continuation", "--samples", "200"]
        argv += ["--context-len", "300", "--max-new-tokens", "5"]
        progress = Path(f"{out}.partial")
    else:
        argv = ["collect", "--model", model, "--calib", str(corpus), "--samples", "40", "--context-len", "200"]
        argv += ["--continuation-len", "32", "--budgets", "16,32", "--no-progress"]
        progress = Path(f"{out}.journal")
    return [sys.executable, "-m", "polykv_search", *argv, "--jobs", "2", "--out", str(out)], progress


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("name", ["score", "collect"])
def test_a_killed_command_leaves_no_worker_or_tracker_behind(name, checkpoint, tmp_path):
    argv, progress = _command(name, checkpoint, tmp_path / "out.json")
    proc = _start(argv, tmp_path)
    try:
        _wait_until(lambda: _lines(progress) >= 2 or proc.poll() is not None, 240, f"{name}'s first finished unit")
        assert proc.poll() is None, proc.stderr.read().decode()
    except BaseException:
        proc.kill()
        raise
    _assert_all_end_after_kill(proc)


def test_ctrl_c_of_score_jobs_2_is_one_line_exit_130_and_counts_what_the_file_holds(checkpoint, tmp_path):
    out = tmp_path / "out.json"
    argv, partial = _command("score", checkpoint, out)
    proc = _start(argv, tmp_path)
    try:
        _wait_until(lambda: _lines(partial) >= 2 or proc.poll() is not None, 240, "score's first finished sample")
    finally:
        below = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C at a terminal: the parent, its workers and trackers
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.decode().splitlines() if "entry×samples" not in line]  # the progress log
    kept = _lines(partial) - 1  # the first line is the run's key
    assert proc.returncode == 130, err.decode()
    assert lines == [f"interrupted: {kept} finished samples kept in {partial}; the same command resumes from there"]
    _wait_until(lambda: not any(_running(p) for p in below), GRACE, "the workers to end")
