"""Cached checkpoints: built once under a temporary name, renamed into place, marked complete last."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Bumped when the layout or content of cached checkpoints changes; old ones are then rebuilt.
CHECKPOINT_FORMAT = 1
_MARKER = "polykv-checkpoint.json"


def _notice(message: str) -> None:
    print(f"polykv-search: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """An exclusive advisory lock (POSIX); yields whether a lock is actually held."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the atomic rename still keeps checkpoints whole
        yield False
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_complete(directory: Path) -> bool:
    return (directory / _MARKER).is_file()


def cached_checkpoint(final: Path, build: Callable[[Path], dict[str, Any]]) -> Path:
    """Return ``final``, building it first if needed with ``build(tmp_dir) -> metadata``.

    The build writes into a fresh temporary directory next to ``final``; the metadata goes into a
    marker file written last; then the directory is renamed to ``final``. A crash leaves at most a
    stale temporary directory (removed by the next build), never a partial ``final``. Concurrent
    processes serialize on a lock file; without locks the first rename wins and the others reuse it."""
    if _is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{final.name}.lock") as locked:
        if _is_complete(final):
            return final
        if locked:  # nobody else is building: leftovers from crashed builds can go
            for stale in final.parent.glob(f".{final.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # no marker: not ours or damaged; never load it
            shutil.rmtree(final, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            meta = dict(build(tmp) or {})
            meta.setdefault("format", CHECKPOINT_FORMAT)
            meta.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            (tmp / _MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            try:
                os.rename(tmp, final)
            except OSError:
                if not _is_complete(final):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
