"""SIGKILL during an atomic write: the old output stays whole, a mixed set is refused, leftovers go.

A child process writes through :mod:`polykv_search.io` with one step of the write replaced by
``os.kill(os.getpid(), SIGKILL)``: halfway through the data, after the data is on disk but before the
rename, between the two renames of a kvpress module and its sidecar, after every rename. The
parent then checks what a reader sees.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polykv_search.io import atomic_write_text, remove_stale_temporaries, stale_temporaries
from strategies import Strategy
from strategies.exporters import ExportError, export_strategy
from strategies.kvpress_sidecar import read_export

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")

ROOT = Path(__file__).resolve().parents[1]
L = 4

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import polykv_search.io as io

    what, target, point = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    calls = {"replace": 0, "fsync": 0}

    if point == "mid-data":
        real_fdopen = os.fdopen
        class Half:
            def __init__(self, fh): self.fh = fh
            def __enter__(self): return self
            def __exit__(self, *exc): return False
            def fileno(self): return self.fh.fileno()
            def write(self, data):
                self.fh.write(data[: len(data) // 2]); self.fh.flush(); os.fsync(self.fh.fileno()); die()
        os.fdopen = lambda fd, mode: Half(real_fdopen(fd, mode))
    elif point.startswith("fsync"):  # fsync:N dies at the N-th file flushed to disk, before any rename
        real_fsync, n = os.fsync, int(point.split(":")[1])
        def fsync(fd):
            real_fsync(fd); calls["fsync"] += 1
            if calls["fsync"] == n: die()
        os.fsync = fsync
    elif point.startswith("replace"):  # replace:N dies after the N-th rename
        real_replace, n = os.replace, int(point.split(":")[1])
        def replace(a, b):
            real_replace(a, b); calls["replace"] += 1
            if calls["replace"] == n: die()
        os.replace = replace

    if what == "file":
        io.atomic_write_text(target, "NEW " * 50_000)
    else:
        from strategies import Strategy
        from strategies.exporters import export_strategy
        export_strategy(Strategy.uniform(4, "tova", 32), "kvpress", target)
    """
)


def run_child(what: str, target: Path, point: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, what, str(target), point], env=env, capture_output=True, timeout=300
    )
    return proc.returncode


OLD = "OLD " * 1000


@pytest.mark.parametrize("point", ["mid-data", "fsync:1"])
def test_a_write_killed_before_its_rename_leaves_the_old_file_whole(point, tmp_path):
    target = tmp_path / "out.json"
    atomic_write_text(target, OLD)
    assert run_child("file", target, point) == -signal.SIGKILL
    assert target.read_text() == OLD
    leftovers = stale_temporaries(target)
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".out.json.")  # hidden, beside it, never read
    atomic_write_text(target, "NEXT")  # the next write clears what the dead writer left
    assert stale_temporaries(target) == [] and target.read_text() == "NEXT"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_write_killed_after_its_rename_is_complete(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_text(target, OLD)
    assert run_child("file", target, "replace:1") == -signal.SIGKILL
    assert target.read_text() == "NEW " * 50_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_live_writers_temporary_file_is_left_alone(tmp_path):
    target = tmp_path / "out.json"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".out.json.{sleeper.pid}.abc.tmp"
        live.write_text("being written")
        assert stale_temporaries(target) == []
        atomic_write_text(target, "x")
        assert live.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert remove_stale_temporaries(target) == [live] and not live.exists()


def old_export(tmp_path: Path) -> tuple[Path, str]:
    module = tmp_path / "press.py"
    old = Strategy.uniform(L, "snapkv", 64)
    export_strategy(old, "kvpress", module)
    return module, old.digest()


@pytest.mark.parametrize("point", ["mid-data", "fsync:1", "fsync:2"])
def test_an_export_killed_while_staging_leaves_the_old_pair(point, tmp_path):
    module, old = old_export(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert run_child("export", module, point) == -signal.SIGKILL
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if not p.name.endswith(".tmp")} == before
    assert read_export(module)["strategy_digest"] == old


def test_an_export_killed_between_its_renames_is_refused_by_the_reader(tmp_path):
    module, old = old_export(tmp_path)
    new = Strategy.uniform(L, "tova", 32).digest()
    assert run_child("export", module, "replace:1") == -signal.SIGKILL
    assert f'STRATEGY_DIGEST = "{new}"' in module.read_text()  # the module was renamed, its sidecar not
    with pytest.raises(ExportError, match=f"the module is of strategy {new}, its sidecar press.json of {old}"):
        read_export(module)
    export_strategy(Strategy.uniform(L, "tova", 32), "kvpress", module)  # exporting again repairs the pair
    assert read_export(module)["strategy_digest"] == new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["press.json", "press.py"]


def test_an_export_killed_after_both_renames_is_the_new_pair(tmp_path):
    module, _ = old_export(tmp_path)
    assert run_child("export", module, "replace:2") == -signal.SIGKILL
    assert read_export(module)["strategy_digest"] == Strategy.uniform(L, "tova", 32).digest()
