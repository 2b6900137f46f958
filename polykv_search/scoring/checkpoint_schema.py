"""The one reader of a score run's checkpoint file (``<out>.partial``): its schema, checked line by line.

The file is JSON lines. Line 1 is the header ``{"key": "<run key>"[, "protocol": "question-aware"]}`` (the
run's :mod:`~polykv_search.protocol`; a header without it is ``question-agnostic``); every later line is
one finished sample::

    {"task": str, "index": int >= 0, "sample": str, "wall": number >= 0,
     "rows": [{"record": {...}, "seconds": number >= 0}, ...]}     # one row per entry, in entry order

and each ``record`` is the results file's per-sample record: ``id`` (the line's ``sample``),
``prediction`` (a string for a generating task; ``{"correct", "total", "nll"[, "kl", "dnll"]}`` for a
teacher-forced one), ``answers`` (a list), ``score`` and the timings ``context_s``, ``question_s``,
``decode_s`` (finite numbers), ``context_tokens``, ``question_tokens``, ``new_tokens`` and
``kv_bytes``, ``full_kv_bytes`` (non-negative numbers).

Anything else is refused with one :class:`~polykv_search.scoring.entries.ScoreError` naming the file
and the first bad line, before any sample is scored. The one exception is a last line that is not
JSON at all: a kill cut it while it was written, so it is dropped (that sample runs again).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykv_search.protocol import AGNOSTIC, PROTOCOLS
from polykv_search.scoring.entries import ScoreError

_START_OVER = "delete it to start over"
_TIMES = ("context_s", "question_s", "decode_s")
_COUNTS = ("context_tokens", "question_tokens", "new_tokens")
_BYTES = ("kv_bytes", "full_kv_bytes")


@dataclass
class PartialFile:
    """What :func:`read_partial` found: the header's key (None: no usable header, nothing kept) and
    protocol, the finished samples by ``(task, index)``, the good lines, and whether a cut last line
    was dropped."""

    key: str | None = None
    protocol: str = AGNOSTIC
    rows: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    dropped: bool = False


class _Bad(Exception):
    """One line breaks the schema (the message says how)."""


def _number(value: Any, what: str, *, low: float | None = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Bad(f"{what} must be a finite number, got {_short(value)}")
    if low is not None and value < low:
        raise _Bad(f"{what} must be >= {low:g}, got {value!r}")


def _count(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Bad(f"{what} must be a non-negative integer, got {_short(value)}")


def _short(value: Any) -> str:
    text = json.dumps(value, allow_nan=True) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{what} must be a JSON object, got {_short(value)}")
    return value


def _prediction(pred: Any, kind: str | None, what: str) -> None:
    if kind == "teacher_forced" or (kind is None and isinstance(pred, dict)):
        pred = _object(pred, what)
        for name in ("correct", "total"):
            _count(pred.get(name), f"{what}.{name}")
        _number(pred.get("nll"), f"{what}.nll", low=None)
        for name in ("kl", "dnll"):
            if name in pred:
                _number(pred[name], f"{what}.{name}", low=None)
    elif not isinstance(pred, str):
        raise _Bad(f"{what} must be a string, got {_short(pred)}")


def check_sample_line(row: Any, entries: int | None, kinds: Mapping[str, str] | None) -> dict[str, Any]:
    """``row`` (one parsed line) if it is a finished sample of this run's shape; ``_Bad`` otherwise."""
    row = _object(row, "the line")
    task, sample = row.get("task"), row.get("sample")
    if not isinstance(task, str):
        raise _Bad(f"task must be a string, got {_short(task)}")
    if kinds is not None and task not in kinds:
        raise _Bad(f"task {task!r} is not one of this run's tasks")
    _count(row.get("index"), "index")
    if not isinstance(sample, str):
        raise _Bad(f"sample must be a string, got {_short(sample)}")
    _number(row.get("wall"), "wall")
    rows = row.get("rows")
    if not isinstance(rows, list):
        raise _Bad(f"rows must be a list, got {_short(rows)}")
    if entries is not None and len(rows) != entries:
        raise _Bad(f"rows has {len(rows)} entries' results, the run has {entries} entries")
    kind = kinds.get(task) if kinds is not None else None
    for i, item in enumerate(rows):
        where = f"rows[{i}]"
        item = _object(item, where)
        _number(item.get("seconds"), f"{where}.seconds")
        record = _object(item.get("record"), f"{where}.record")
        if record.get("id") != sample:
            raise _Bad(f"{where}.record.id is {_short(record.get('id'))}, not the line's sample {sample!r}")
        _prediction(record.get("prediction"), kind, f"{where}.record.prediction")
        if not isinstance(record.get("answers"), list):
            raise _Bad(f"{where}.record.answers must be a list, got {_short(record.get('answers'))}")
        _number(record.get("score"), f"{where}.record.score", low=None)
        for name in _TIMES + _BYTES:
            _number(record.get(name), f"{where}.record.{name}")
        for name in _COUNTS:
            _count(record.get(name), f"{where}.record.{name}")
    return row


def read_partial(
    path: str | Path, *, entries: int | None = None, kinds: Mapping[str, str] | None = None
) -> PartialFile:
    """Read and check the checkpoint file ``path`` (missing or empty: nothing kept).

    Parameters
    ----------
    entries
        The run's number of entries: every line must hold one result per entry.
    kinds
        ``{task name: task kind}`` of the run: every line's task must be one of them, and its
        predictions of that kind (``generate``: strings; ``teacher_forced``: objects).

    Raises
    ------
    ScoreError
        One line naming ``path`` and the first line that breaks the schema.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return PartialFile()
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ScoreError(f"cannot read {path}: {err.strerror or err}; {_START_OVER}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ScoreError(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start}), not a score checkpoint; {_START_OVER}"
        ) from None
    numbered = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    found = PartialFile()
    if not numbered:
        return found

    def refuse(n: int, why: str) -> ScoreError:
        return ScoreError(f"{path}: line {n}: {why}; not a checkpoint of this score run, {_START_OVER}")

    last = numbered[-1][0]
    for n, line in numbered:
        try:
            value = json.loads(line, parse_constant=_no_constants)
        except json.JSONDecodeError as err:
            if n == last:  # a kill cut the line being written: drop it
                found.dropped = True
                break
            raise refuse(n, f"not JSON ({err.msg} at column {err.colno})") from None
        except (_Bad, ValueError) as err:  # NaN/Infinity, an integer too long to read
            raise refuse(n, str(err)) from None
        except RecursionError:
            raise refuse(n, "JSON nested too deeply") from None
        if n == numbered[0][0]:
            if not isinstance(value, dict) or not isinstance(value.get("key"), str):
                raise refuse(n, 'not a checkpoint header ({"key": ...})')
            protocol = value.get("protocol", AGNOSTIC)
            if protocol not in PROTOCOLS:
                raise refuse(n, f"protocol must be one of {', '.join(PROTOCOLS)}, got {_short(protocol)}")
            found.key, found.protocol = value["key"], protocol
        else:
            try:
                row = check_sample_line(value, entries, kinds)
            except _Bad as err:
                raise refuse(n, str(err)) from None
            at = (row["task"], row["index"])
            if at in found.rows:
                raise refuse(n, f"sample {row['index']} of {row['task']} is there twice")
            found.rows[at] = row
        found.lines.append(line)
    return found


def _no_constants(token: str) -> Any:
    raise _Bad(f"{token} is not a valid JSON number")


__all__ = ["PartialFile", "check_sample_line", "read_partial"]
