"""Small I/O helpers shared by every layer: atomic writes (one file or a set) and JSON.

They live in ``strategies``, the bottom layer, so that strategies and exporters can write files
without importing the core; :mod:`polykv_search.io` re-exports them under their old import path.

:func:`read_text` reads a file whole, decompressing a ``.xz`` or ``.gz`` one on the way (``studies/`` keeps its
large JSON files xz-compressed), so every loader takes either form.

A write goes to a hidden temporary file beside its target (``.NAME.PID.RANDOM.tmp``), is flushed
to disk, then renamed over the target, so readers see the old file or the new one, never half of
either. A process killed before the rename leaves only its temporary file behind; the next write
to the same target removes such leftovers of processes that no longer run (a live writer's file is
left alone), and no reader ever opens them.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import lzma
import os
import stat
import tempfile
import threading
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: a compressed file's opener, by its last suffix
_OPENERS: dict[str, Callable[[Path], io.BufferedIOBase]] = {
    ".xz": lambda path: lzma.LZMAFile(path, "rb"),
    ".gz": lambda path: gzip.GzipFile(path, "rb"),
}


def read_text(path: str | Path) -> str:
    """The UTF-8 text of ``path``; a ``.xz`` or ``.gz`` file is decompressed first.

    Raises :class:`OSError` as :meth:`Path.read_text` does (a corrupt or truncated compressed file too, with
    the reason as its ``strerror``) and :class:`UnicodeDecodeError` for bytes that are not UTF-8.
    """
    path = Path(path)
    opener = _OPENERS.get(path.suffix)
    if opener is None:
        return path.read_text(encoding="utf-8")
    try:
        with opener(path) as f:
            data = f.read()
    except (lzma.LZMAError, EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise OSError(errno.EINVAL, f"not a valid {path.suffix[1:]} file ({err})") from None
    return data.decode("utf-8")


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):  # someone else's process, or no way to tell: leave it
        return True
    return True


def stale_temporaries(path: str | Path) -> list[Path]:
    """Temporary files of earlier writes to ``path`` whose writer process is gone."""
    path = Path(path)
    prefix = _tmp_prefix(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    stale = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix) :].split(".", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
            stale.append(path.parent / name)
    return sorted(stale)


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete :func:`stale_temporaries` of ``path``; returns what was removed."""
    removed = []
    for tmp in stale_temporaries(path):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:  # another process cleaned it first
            pass
    return removed


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported everywhere (Windows); the rename itself is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_umask_lock = threading.Lock()


def _target_mode(path: Path) -> int:
    """The permission bits an ordinary ``open(path, "w")`` would leave: the existing file's, else
    ``0o666`` less the process umask (``mkstemp`` itself creates ``0o600``: private to the user)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        pass
    with _umask_lock:  # os.umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def _stage(path: Path, data: bytes) -> Path:
    """Write ``data`` to a fresh temporary file beside ``path`` with the mode the target would get,
    flushed to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{_tmp_prefix(path)}{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):  # not on Windows, where mkstemp's mode is the ordinary one
                os.fchmod(fh.fileno(), _target_mode(path))
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write_files(files: Mapping[Path, bytes | str] | Mapping[str, bytes | str]) -> list[Path]:
    """Write several files as one set: all are staged first, then renamed in order.

    A failure while staging (disk full, a folder that cannot be made, Ctrl-C) writes none of them.
    The renames themselves take microseconds; a process killed between two of them leaves some
    targets new and some old, which is why multi-file formats also record a digest of their
    content in each file so that readers can refuse a mixed set. ``str`` values are UTF-8 encoded.
    Returns the target paths in order.
    """
    targets = [Path(p) for p in files]
    if len({t.absolute() for t in targets}) != len(targets):
        raise ValueError("atomic_write_files: the same target twice")
    for target in targets:  # what would make a rename fail, refused before anything is renamed
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    staged: list[Path] = []
    try:
        for target, data in zip(targets, files.values()):
            staged.append(_stage(target, data.encode("utf-8") if isinstance(data, str) else data))
    except BaseException:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    pending = list(zip(staged, targets))
    try:
        while pending:
            tmp, target = pending[0]
            os.replace(tmp, target)
            pending.pop(0)
    except BaseException:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)
        raise
    for directory in {t.absolute().parent for t in targets}:
        _fsync_dir(directory)
    return targets


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    return atomic_write_files({Path(path): data})[0]


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically. NaN and infinities are refused (``ValueError``):
    they are not JSON, and no reader of this project's files accepts them."""
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
