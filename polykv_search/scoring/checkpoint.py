"""A score run's finished samples, kept beside its results file so that a stopped run resumes.

``score --out R.json`` appends one JSON line per finished sample to ``R.json.partial``: every entry's
per-sample record, KV bytes and seconds. Rerun with the same command, it replays those samples and
runs only the rest; the results file is the one an uninterrupted run writes (but for wall times).
The file's first line is a key (settings, entries, samples, model, and the versions of
polykv-search, torch and transformers) and the run's protocol: a partial file of another run is
refused, never mixed in, and one written under the other protocol is refused saying so.
It is removed once the results file is written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykv_search.io import atomic_write_text
from polykv_search.protocol import AGNOSTIC
from polykv_search.scoring.checkpoint_schema import read_partial
from polykv_search.scoring.entries import ScoreError


def run_key(**parts: Any) -> str:
    """A hash of everything a run's results depend on (JSON-serializable parts)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, allow_nan=False).encode("utf-8")).hexdigest()[:24]


@dataclass
class Checkpoint:
    """The finished samples of one run by ``(task, index)``; :meth:`open` reads or starts the file."""

    path: Path
    key: str
    protocol: str = AGNOSTIC
    done: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        path: str | Path,
        key: str,
        *,
        entries: int | None = None,
        kinds: Mapping[str, str] | None = None,
        protocol: str = AGNOSTIC,
    ) -> Checkpoint:
        """Resume from ``path`` if it holds this run (same ``key``), else start it. The file is read
        through one validating reader (:func:`~polykv_search.scoring.checkpoint_schema.read_partial`,
        with the run's ``entries`` count and task ``kinds``); a file it cannot use, or another run's,
        is a one-line :class:`ScoreError`, as is one written under the other ``protocol``. A last line cut
        off by a kill is dropped (that sample runs again)."""
        path = Path(path)
        cp = cls(path, key, protocol)
        found = read_partial(path, entries=entries, kinds=kinds)
        if found.key is None:
            if found.dropped:  # killed while writing its first line: nothing kept
                path.unlink()
            return cp
        check_partial_protocol(path, found.protocol, protocol)
        if found.key != key:
            raise ScoreError(
                f"{path} holds a stopped score run of other settings, entries, samples or code versions; "
                "delete it to start over"
            )
        cp.done = dict(found.rows)
        if found.dropped:
            atomic_write_text(path, "\n".join(found.lines) + "\n")  # later lines must not follow a cut one
        return cp

    def get(self, task: str, index: int, sample_id: str) -> dict[str, Any] | None:
        """The finished sample ``index`` of ``task`` (``rows``: one per entry; ``wall``), or None."""
        row = self.done.get((task, index))
        if row is not None and row["sample"] != sample_id:
            raise ScoreError(f"{self.path}: sample {index} of {task} is {row['sample']!r}, not {sample_id!r}")
        return row

    def add(self, task: str, index: int, sample_id: str, rows: list[dict[str, Any]], wall: float) -> None:
        """Append one finished sample (flushed to disk before the next sample starts)."""
        row = {"task": task, "index": index, "sample": sample_id, "wall": wall, "rows": rows}
        text = json.dumps(row, allow_nan=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)  # the folders --out may still lack
        if not self.path.exists() or self.path.stat().st_size == 0:
            header = {"key": self.key, **({"protocol": self.protocol} if self.protocol != AGNOSTIC else {})}
            text = json.dumps(header) + "\n" + text  # no protocol: question-agnostic (as before protocols)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        self.done[(task, index)] = row

    def kept(self) -> int:
        """The finished samples the file holds now: what a rerun resumes from (Ctrl-C may land after a sample's
        line is written and before :attr:`done` counts it)."""
        try:
            return len(read_partial(self.path).rows)
        except ScoreError:
            return len(self.done)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def check_partial_protocol(path: str | Path, found: str, protocol: str) -> None:
    """Refuse (one line) resuming the checkpoint ``path``, written under protocol ``found``, in a run of
    ``protocol``: its samples were prefilled with the other split and must not be mixed in."""
    if found != protocol:
        raise ScoreError(
            f"{path} holds a stopped score run of the {found} protocol, this run is {protocol}; "
            "rerun it as it was or delete the file to start over"
        )
