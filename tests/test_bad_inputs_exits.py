"""Errors that are bugs keep their traceback; Ctrl-C exits 130 in one line; a closed stdout exits quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polykv_search.cli import main
from tests.bad_inputs_support import (
    LINUX,
    make,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
)

# --------------------------------------------------------------------------------------------
# Errors that are bugs keep their traceback; Ctrl-C is one line and 130


def test_an_unexpected_exception_keeps_its_traceback(tmp_path, monkeypatch):
    import polykv_search.cli.show as show

    def bug(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(show, "run", bug)
    make("strategy", tmp_path / "s.json")
    with pytest.raises(ZeroDivisionError):
        main(["show", str(tmp_path / "s.json")])


@pytest.mark.parametrize("where", ["start-up", "command"])
def test_ctrl_c_exits_130_with_one_line(where, tmp_path, monkeypatch, capsys):
    import polykv_search.cli as cli
    import polykv_search.cli.show as show

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupt) if where == "start-up" else monkeypatch.setattr(
        show, "run", interrupt
    )
    make("strategy", tmp_path / "s.json")
    assert main(["show", str(tmp_path / "s.json")]) == 130
    out, err = capsys.readouterr()
    assert err == "interrupted\n" and out == ""


def test_ctrl_c_says_where_the_finished_work_is_in_the_same_line(tmp_path, monkeypatch, capsys):
    import polykv_search.cli.show as show
    from polykv_search.cli.common import Interrupted

    def interrupt(args):
        raise Interrupted("finished cells are kept in o.json.journal; rerun the same command to continue")

    monkeypatch.setattr(show, "run", interrupt)
    make("strategy", tmp_path / "s.json")
    assert main(["show", str(tmp_path / "s.json")]) == 130
    assert (
        capsys.readouterr().err
        == "interrupted: finished cells are kept in o.json.journal; rerun the same command to continue\n"
    )


def test_a_command_run_by_another_raises_for_its_caller(tmp_path, capsys):
    """``invoke`` has no boundary: quickstart can name its step in the one line ``main`` prints."""
    from polykv_search.cli import UsageError, invoke, is_user_error
    from polykv_search.cli.common import CLIError

    with pytest.raises(CLIError, match="cannot read") as err:
        invoke(["show", str(tmp_path / "missing.json")])
    assert is_user_error(err.value)
    with pytest.raises(UsageError, match="empty budget") as err:
        invoke(["collect", "--budgets", "32,,64", "--out", str(tmp_path / "o.json")])
    assert is_user_error(err.value) and not is_user_error(ZeroDivisionError())
    assert capsys.readouterr().err == ""


#: runs ``python -m polykv_search`` after saying "ready" (Python's SIGINT handler is in place by then)
READY_THEN_CLI = (
    "import runpy, sys; sys.stderr.write('ready\\n'); sys.stderr.flush(); "
    "runpy.run_module('polykv_search', run_name='__main__')"
)


@pytest.mark.skipif(not LINUX, reason="POSIX signals")
@pytest.mark.parametrize("delay", [0.2, 4.0])
def test_ctrl_c_in_a_real_process_during_imports_or_work(delay, tmp_path):
    """SIGINT 0.2 s after start-up lands in the CLI's imports (seconds of torch, transformers, ...);
    at 4 s in the imports or in a blocked read (stdin never closes)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-c", READY_THEN_CLI, "generate", "--prompt-file", "/dev/stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
        # as at a terminal: a shell's background job inherits SIGINT ignored, and Python then never
        # installs its handler (the test would measure how pytest was launched, not the CLI)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr.readline() == b"ready\n"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert err.decode() == "interrupted\n" and out == b""


def test_a_broken_pipe_on_plain_stdout_exits_141_silently(tmp_path, monkeypatch, capsys):
    import polykv_search.cli.show as show

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(show, "run", closed_pipe)
    make("strategy", tmp_path / "s.json")
    assert main(["show", str(tmp_path / "s.json")]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not LINUX, reason="POSIX pipes")
def test_a_reader_that_leaves_early_is_not_an_error_report(tmp_path):
    """``polykv-search show s.json | head -1``: stdout closes under the writer; no traceback, a non-zero exit
    (rich's console exits 1 on a broken pipe, plain ``sys.stdout`` writes exit 141 as a shell would)."""
    make("strategy", tmp_path / "s.json")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polykv_search", "show", "s.json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (1, 141) and err == ""


# --------------------------------------------------------------------------------------------
# Benchmarks and scripts run behind the same boundary (``polykv_search.cli.run_script``)


def test_a_scripts_bad_model_path_is_one_line_and_exit_2(capsys):
    from polykv_search.cli import run_script
    from polykv_search.models import load_model

    with pytest.raises(SystemExit) as done:
        run_script(lambda: load_model("/no/such/model"))
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: model path '/no/such/model' does not exist"


def test_a_scripts_bug_keeps_its_traceback_and_its_exit_code_passes_through():
    from polykv_search.cli import run_script

    with pytest.raises(ZeroDivisionError):
        run_script(lambda: 1 / 0)
    for code, exits in ((None, 0), (0, 0), (3, 3)):
        with pytest.raises(SystemExit) as done:
            run_script(lambda code=code: code)
        assert done.value.code == exits


def test_every_script_that_loads_a_model_runs_behind_the_boundary():
    root = Path(__file__).resolve().parents[1]
    for path in sorted((*root.glob("benchmarks/*.py"), *root.glob("scripts/*.py"))):
        text = path.read_text()
        if "load_model(args.model" in text:
            assert "run_script(main)" in text, f"{path.name} would show a bad --model as a traceback"
