"""Reading ``polykv-search score`` results files (schema ``polykv-results``, versions 1 and 2)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polykv_search.scoring import RESULTS_SCHEMA

#: results versions this module reads: 1 (per-sample scores) and 2 (adds per-sample KL / ΔNLL on
#: teacher-forced tasks, ``provenance.engine`` and ``provenance.timing``; entry ``seconds`` may be null)
SUPPORTED_VERSIONS = (1, 2)


class CompareError(ValueError):
    """Results that cannot be compared (unreadable, wrong schema, mismatched runs)."""


@dataclass(frozen=True)
class TaskSamples:
    """Per-sample records of one entry on one task, sorted by sample id.

    Attributes
    ----------
    ids : tuple of str
        Sample ids, sorted (every entry of a run has the same ones).
    score : tuple of float
        Per-sample scores (0-100).
    kl, dnll : tuple of float or None
        Per-sample mean per-token KL(FullKV ‖ entry) and NLL_entry − NLL_FullKV (nats) on
        teacher-forced tasks of version-2 files; None elsewhere.
    """

    ids: tuple[str, ...]
    score: tuple[float, ...]
    kl: tuple[float, ...] | None = None
    dnll: tuple[float, ...] | None = None

    def values(self, measure: str) -> tuple[float, ...] | None:
        return getattr(self, measure)

    def mean(self, measure: str = "score") -> float | None:
        v = self.values(measure)
        return sum(v) / len(v) if v else None


def load_results(path: str | Path) -> dict[str, Any]:
    """Read and check one results file; raises :class:`CompareError` with a one-line reason."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise CompareError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise CompareError(f"{path}: not a text file (a `polykv-search score` results JSON)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise CompareError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    check_results(doc, str(path))
    return doc


def check_results(doc: Any, where: str = "results") -> None:
    """Raise :class:`CompareError` unless ``doc`` is a readable results document."""
    if not isinstance(doc, dict):
        raise CompareError(f"{where}: the top level must be a JSON object")
    if doc.get("schema") != RESULTS_SCHEMA:
        raise CompareError(f"{where}: schema is {doc.get('schema')!r}, expected {RESULTS_SCHEMA!r} (a `polykv-search score` results file)")
    version = doc.get("version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        known = " and ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise CompareError(f"{where}: unsupported results version {version!r} (this polykv-search reads versions {known})")
    prov = doc.get("provenance")
    if not isinstance(prov, dict) or not isinstance(prov.get("tasks", {}), dict):
        raise CompareError(f"{where}: provenance missing or malformed")
    if not isinstance(prov.get("settings", {}), dict):
        raise CompareError(f"{where}: provenance.settings must be an object")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise CompareError(f"{where}: entries must be a list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise CompareError(f"{where}: entries[{i}] must be an object with a name")
        for key in ("scores", "suites", "extra", "tasks"):
            if not isinstance(e.get(key) or {}, dict):
                raise CompareError(f"{where}: entries[{i}].{key} must be an object")
        for key in ("scores", "suites"):
            for name, v in (e.get(key) or {}).items():
                if _number(v) is None:
                    raise CompareError(f"{where}: entries[{i}] ({e['name']}) {key}.{name} must be a finite number, got {v!r}")
        entry_samples(e, f"{where}: entries[{i}] ({e['name']})")


def entry_samples(e: dict[str, Any], where: str = "entry") -> dict[str, TaskSamples]:
    """The per-sample records of every task of an entry that has them (``tasks[t].per_sample``)."""
    out: dict[str, TaskSamples] = {}
    for task, result in (e.get("tasks") or {}).items():
        records = result.get("per_sample") if isinstance(result, dict) else None
        if records is None or records == []:
            continue  # no records (a task without samples): its scores have no interval
        if not isinstance(records, list):
            raise CompareError(f"{where}: tasks[{task}].per_sample must be a list")
        ids, scores, kl, dnll = [], [], [], []
        for j, rec in enumerate(records):
            if not isinstance(rec, dict) or "id" not in rec or _number(rec.get("score")) is None:
                raise CompareError(f"{where}: tasks[{task}].per_sample[{j}] needs an id and a finite score")
            ids.append(str(rec["id"]))
            scores.append(_number(rec["score"]))
            kl.append(_number(rec.get("kl")))
            dnll.append(_number(rec.get("dnll")))
        if len(set(ids)) != len(ids):
            raise CompareError(f"{where}: tasks[{task}].per_sample has repeated sample ids")
        # one canonical order (by id): the same samples give the same resamples whatever a file's order
        order = sorted(range(len(ids)), key=ids.__getitem__)
        out[task] = TaskSamples(tuple(ids[i] for i in order), *(_in_order(v, order) for v in (scores, kl, dnll)))
    return out


def _in_order(values: list[float | None], order: list[int]) -> tuple[float, ...] | None:
    """``values`` permuted by ``order``; None unless every sample has a value."""
    if any(v is None for v in values):
        return None
    return tuple(values[i] for i in order)  # type: ignore[misc]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)
