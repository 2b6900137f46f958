"""The collection journal: an append-only JSON-lines file next to the output, one line per finished
unit, so that an interrupted collection resumes without recomputing anything finished.

Line 1 is a header with the run's *key* (model fingerprint, calibration fingerprint, grid, lengths,
method, dtype, signal definitions version); later lines are records (``{"kind": "full", ...}`` per
sample, ``{"kind": "unit", ...}`` per (sample, layer, phase)). Each line is flushed and fsynced as it
is written; a torn last line (a crash mid-write) is ignored. Opening a journal whose key differs from
the run's is refused with a one-line :class:`JournalMismatch` naming what changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO, TypeVar

from strategies.io import atomic_write_text

JOURNAL_FORMAT = "polykv-signals-journal"
JOURNAL_VERSION = 1

#: Key fields, in the order a mismatch is reported, with the words used in the message.
KEY_FIELDS = {
    "model": "model",
    "model_fingerprint": "model (architecture/config)",
    "calibration": "calibration set",
    "context_len": "context length",
    "continuation_len": "continuation length",
    "layers": "layer grid",
    "phases": "phases",
    "patterns": "patterns",
    "budgets": "budgets",
    "method": "method (--naive)",
    "dtype": "dtype",
    "definitions": "signal definitions (code version)",
    "blocks": "token blocks per continuation",
}


class JournalError(ValueError):
    """A journal that cannot be used (unreadable, not a journal, or from a different run)."""


class JournalMismatch(JournalError):
    pass


def journal_path(out: str | Path) -> Path:
    """Where the journal of an output file lives: ``signals.json`` → ``signals.json.journal``."""
    out = Path(out)
    return out.with_name(out.name + ".journal")


_J = TypeVar("_J", bound="Journal")


class Journal:
    """Finished records of one collection, on disk and in memory.

    Another kind of journal (e.g. a search's evaluated strategies) subclasses it with its own
    ``format``, ``version``, ``what`` (its name in messages), ``key_fields`` and :meth:`_remember`."""

    format = JOURNAL_FORMAT
    version = JOURNAL_VERSION
    what = "collection journal"
    key_fields = KEY_FIELDS

    def __init__(self, path: str | Path | None, key: Mapping[str, Any]):
        self.path = None if path is None else Path(path)
        self.key = dict(key)
        self.full: dict[int, dict] = {}
        self.units: dict[tuple[int, int, str], dict] = {}
        self._fh: TextIO | None = None

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls: type[_J], path: str | Path | None, key: Mapping[str, Any], *, fresh: bool = False) -> _J:
        """Load an existing journal (checking its key) or start a new one (``path=None``: in memory)."""
        journal = cls(path, key)
        if journal.path is None:
            return journal
        if fresh and journal.path.exists():
            journal.path.unlink()
        if journal.path.exists():
            journal._load(journal.path)
        else:
            journal.path.parent.mkdir(parents=True, exist_ok=True)
            journal._append({"format": cls.format, "version": cls.version, "key": journal.key})
        return journal

    @property
    def resumed(self) -> bool:
        return bool(self.full or self.units)

    def _load(self, path: Path) -> None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise JournalError(f"cannot read the journal {self.path}: {err}") from None
        header = _parse(lines[0]) if lines else None
        if not isinstance(header, dict) or header.get("format") != self.format:
            raise JournalError(f"{self.path} is not a polykv-search {self.what}; move it away or pass --fresh")
        if header.get("version") != self.version:
            raise JournalError(
                f"{self.path} has journal version {header.get('version')!r}, expected {self.version}; pass --fresh"
            )
        self.check_key(header.get("key") or {})
        good = 1
        for i, line in enumerate(lines[1:], start=1):
            rec = _parse(line)
            if not isinstance(rec, dict):
                if i == len(lines) - 1:  # torn last line: drop it
                    break
                raise JournalError(f"{self.path}: line {i + 1} is corrupt; pass --fresh to start over")
            self._remember(rec)
            good = i + 1
        if good < len(lines):
            # rewrite without the torn line so that appends start on a fresh line
            atomic_write_text(path, "\n".join(lines[:good]) + "\n")  # fsynced, then renamed

    def check_key(self, other: Mapping[str, Any]) -> None:
        for field, words in self.key_fields.items():
            mine, theirs = self.key.get(field), other.get(field)
            if _canon(mine) != _canon(theirs):
                raise JournalMismatch(
                    f"{self.path} holds a partial {self.what.split()[0]} with a different {words} "
                    f"({_short(theirs)} there, {_short(mine)} now); rerun the original command to finish it, "
                    f"or pass --fresh to discard it"
                )

    # ------------------------------------------------------------------ records
    def _remember(self, rec: dict) -> None:
        if rec.get("kind") == "full":
            self.full[int(rec["sample"])] = rec
        elif rec.get("kind") == "unit":
            self.units[(int(rec["sample"]), int(rec["layer"]), str(rec["phase"]))] = rec

    def add(self, rec: dict) -> None:
        """Persist one finished record (flushed and fsynced before returning)."""
        self._append(rec)
        self._remember(rec)

    def _append(self, obj: dict) -> None:
        if self.path is None:
            return
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def remove(self) -> None:
        self.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _parse(line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."
