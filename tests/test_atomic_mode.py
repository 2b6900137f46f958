"""An atomic write leaves the permissions an ordinary write would: a new file gets ``0o666`` less the
umask (not ``mkstemp``'s private ``0o600``), a rewritten file keeps the mode it had."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from polykv_search.io import atomic_write_files, atomic_write_text, write_json

pytestmark = pytest.mark.skipif(sys.platform.startswith("win"), reason="POSIX permission bits")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    os.umask(old)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_a_new_file_gets_0666_less_the_umask(tmp_path, umask, mask):
    umask(mask)
    target = tmp_path / "results.json"
    write_json(target, {"a": 1})
    with open(tmp_path / "plain.txt", "w") as fh:  # what an ordinary write gives
        fh.write("x")
    assert _mode(target) == 0o666 & ~mask == _mode(tmp_path / "plain.txt")


def test_a_rewritten_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "strategy.json"
    atomic_write_text(target, "old")
    os.chmod(target, 0o640)
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and _mode(target) == 0o640


def test_the_umask_is_left_as_it_was(tmp_path, umask):
    umask(0o027)
    atomic_write_files({tmp_path / "a.py": "a", tmp_path / "a.json": "{}"})
    assert os.umask(0o027) == 0o027
    assert _mode(tmp_path / "a.py") == _mode(tmp_path / "a.json") == 0o640
