"""Reading ``polykv-search score`` results files (schema ``polykv-results``, versions 1 and 2)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from polykv_search.io import read_text
from polykv_search.protocol import PROTOCOLS
from polykv_search.scoring import RESULTS_SCHEMA
from strategies import PHASES

#: results versions this module reads: 1 (per-sample scores) and 2 (adds per-sample KL / ΔNLL on
#: teacher-forced tasks, ``provenance.engine`` and ``provenance.timing``; entry ``seconds`` may be null)
SUPPORTED_VERSIONS = (1, 2)
#: object keys written bare in a JSON path (others are JSON-quoted)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_/\-]+")


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
    #: per position bucket (``0-128``, ...), the per-sample mean KL over that bucket's positions, on
    #: trajectory tasks (the decode suite); None elsewhere or when the samples' buckets differ
    kl_buckets: dict[str, tuple[float, ...]] | None = None

    def values(self, measure: str) -> tuple[float, ...] | None:
        return getattr(self, measure)

    def mean(self, measure: str = "score") -> float | None:
        v = self.values(measure)
        return sum(v) / len(v) if v else None


def load_results(path: str | Path) -> dict[str, Any]:
    """Read and check one results file (``.json``, or ``.json.xz`` / ``.json.gz``); raises :class:`CompareError`
    with a one-line reason."""
    path = Path(path)
    try:
        text = read_text(path)
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
    """Raise :class:`CompareError` unless ``doc`` is a readable results document.

    Checks the type of every field the compare package reads later, so that a malformed file is
    refused here in one line naming the field's JSON path (``entries[2].strategy.layers[0].prefill``).
    Fields it never reads (``seconds``, ``params``, ``timing``, runtime settings, ...) are not checked.
    """
    if not isinstance(doc, dict):
        raise CompareError(f"{where}: the top level must be a JSON object")
    if doc.get("schema") != RESULTS_SCHEMA:
        raise CompareError(
            f"{where}: schema is {doc.get('schema')!r}, expected {RESULTS_SCHEMA!r} "
            "(a `polykv-search score` results file)"
        )
    version = doc.get("version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        known = " and ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise CompareError(
            f"{where}: unsupported results version {version!r} (this polykv-search reads versions {known})"
        )
    check = _Checker(where)
    prov = doc.get("provenance")
    if not isinstance(prov, dict):
        check.fail("provenance", "an object", prov)
    check.provenance(prov)
    entries = doc.get("entries")
    if not isinstance(entries, list):
        check.fail("entries", "a list", entries)
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise CompareError(f"{where}: entries[{i}] must be an object with a name (a string)")
        check.entry(e, f"entries[{i}]")
        for key in ("scores", "suites"):
            for name, v in (e.get(key) or {}).items():
                if _number(v) is None:
                    raise CompareError(
                        f"{where}: entries[{i}] ({_safe(e['name'])}) {key}.{_safe(name)} "
                        f"must be a finite number, got {v!r}"
                    )
        entry_samples(e, f"{where}: entries[{i}] ({_safe(e['name'])})")


def entry_samples(e: dict[str, Any], where: str = "entry") -> dict[str, TaskSamples]:
    """The per-sample records of every task of an entry that has them (``tasks[t].per_sample``)."""
    out: dict[str, TaskSamples] = {}
    for task, result in (e.get("tasks") or {}).items():
        records = result.get("per_sample") if isinstance(result, dict) else None
        if records is None or records == []:
            continue  # no records (a task without samples): its scores have no interval
        if not isinstance(records, list):
            raise CompareError(f"{where}: tasks[{_safe(task)}].per_sample must be a list")
        ids, scores, kl, dnll, buckets = [], [], [], [], []
        for j, rec in enumerate(records):
            if not isinstance(rec, dict) or "id" not in rec or _number(rec.get("score")) is None:
                raise CompareError(f"{where}: tasks[{_safe(task)}].per_sample[{j}] needs an id and a finite score")
            ids.append(str(rec["id"]))
            scores.append(_number(rec["score"]))
            kl.append(_number(rec.get("kl")))
            dnll.append(_number(rec.get("dnll")))
            buckets.append(rec.get("kl_buckets"))
        if len(set(ids)) != len(ids):
            raise CompareError(f"{where}: tasks[{_safe(task)}].per_sample has repeated sample ids")
        # one canonical order (by id): the same samples give the same resamples whatever a file's order
        order = sorted(range(len(ids)), key=ids.__getitem__)
        out[task] = TaskSamples(
            tuple(ids[i] for i in order), *(_in_order(v, order) for v in (scores, kl, dnll)), _buckets(buckets, order)
        )
    return out


def _buckets(records: list[Any], order: list[int]) -> dict[str, tuple[float, ...]] | None:
    """Per bucket, the samples' KL in ``order``; None unless every sample has the same finite buckets."""
    if not records or not isinstance(records[0], dict) or not records[0]:
        return None
    names = list(records[0])
    if any(not isinstance(r, dict) or list(r) != names for r in records):
        return None
    columns = {name: [_number(r[name]) for r in records] for name in names}
    out = {name: _in_order(values, order) for name, values in columns.items()}
    return None if any(v is None for v in out.values()) else out  # type: ignore[return-value]


def _in_order(values: list[float | None], order: list[int]) -> tuple[float, ...] | None:
    """``values`` permuted by ``order``; None unless every sample has a value."""
    if any(v is None for v in values):
        return None
    return tuple(values[i] for i in order)  # type: ignore[misc]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _safe(text: str) -> str:
    """``text`` as is when printable, else JSON-quoted (a message stays on one line)."""
    return text if text.isprintable() else json.dumps(text)


def _at(path: str, key: str | int) -> str:
    """The JSON path of ``key`` inside ``path``: ``a.b``, ``a[0]``, ``a."odd key"``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    name = key if _PLAIN_KEY.fullmatch(key) else json.dumps(key)
    return f"{path}.{name}" if path else name


def _got(v: Any) -> str:
    """A short, one-line description of a JSON value."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        text = json.dumps(v)
        return "the string " + (text if len(text) <= 40 else text[:36] + '..."')
    return repr(v)


class _Checker:
    """Type checks of one results document; every refusal is one line naming the file and JSON path."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, expected: str, value: Any) -> NoReturn:
        raise CompareError(f"{self.where}: {path}: expected {expected}, got {_got(value)}")

    def obj(self, v: Any, path: str, *, null: bool = True) -> dict[str, Any]:
        """``v`` when an object; {} for null (when ``null``)."""
        if v is None and null:
            return {}
        if not isinstance(v, dict):
            self.fail(path, "an object" + (" or null" if null else ""), v)
        return v

    def array(self, v: Any, path: str) -> list[Any]:
        if v is None:
            return []
        if not isinstance(v, list):
            self.fail(path, "a list or null", v)
        return v

    def string(self, v: Any, path: str, *, null: bool = True) -> None:
        if not (isinstance(v, str) or (v is None and null)):
            self.fail(path, "a string" + (" or null" if null else ""), v)

    def number(self, v: Any, path: str, *, integer: bool = False) -> None:
        """A finite number (an integer when ``integer``) or null."""
        if v is None:
            return
        ok = _number(v) is not None and (not integer or float(v).is_integer())
        if not ok:
            self.fail(path, f"{'an integer' if integer else 'a finite number'} or null", v)

    def provenance(self, prov: dict[str, Any]) -> None:
        self.string(prov.get("model"), "provenance.model")
        self.string(prov.get("model_fingerprint"), "provenance.model_fingerprint")
        self.string(prov.get("engine"), "provenance.engine")
        if prov.get("protocol") is not None and prov.get("protocol") not in PROTOCOLS:
            self.fail("provenance.protocol", " or ".join(PROTOCOLS) + " or null", prov.get("protocol"))
        settings = self.obj(prov.get("settings", {}), "provenance.settings", null=False)
        self.number(settings.get("budget"), "provenance.settings.budget")
        for key in ("samples", "context_len", "seed"):
            self.number(settings.get(key), f"provenance.settings.{key}", integer=True)
        tasks = self.obj(prov.get("tasks", {}), "provenance.tasks", null=False)
        for task, info in tasks.items():
            path = _at("provenance.tasks", task)
            info = self.obj(info, path, null=False)
            self.string(info.get("suite"), _at(path, "suite"))
            self.string(info.get("samples"), _at(path, "samples"))

    def entry(self, e: dict[str, Any], path: str) -> None:
        for key in ("kind", "solver", "strategy_digest"):
            self.string(e.get(key), _at(path, key))
        for key in ("global_budget", "kv_bytes", "full_kv_bytes", "kv_ratio"):
            self.number(e.get(key), _at(path, key))
        for key in ("scores", "suites", "extra"):
            self.obj(e.get(key), _at(path, key))
        self.strategy(self.obj(e.get("strategy"), _at(path, "strategy")), _at(path, "strategy"))
        tasks_path = _at(path, "tasks")
        for task, result in self.obj(e.get("tasks"), tasks_path).items():
            task_path = _at(tasks_path, task)
            result = self.obj(result, task_path, null=False)
            records_path = _at(task_path, "per_sample")
            for j, rec in enumerate(self.array(result.get("per_sample"), records_path)):
                if not isinstance(rec, dict):
                    continue  # refused by entry_samples, with the message it always gave
                rec_path = _at(records_path, j)
                sample_id = rec.get("id")
                if sample_id is not None and (isinstance(sample_id, bool) or not isinstance(sample_id, (str, int))):
                    self.fail(_at(rec_path, "id"), "a string or integer", sample_id)
                for key in ("kl", "dnll"):
                    self.number(rec.get(key), _at(rec_path, key))
                buckets = self.obj(rec.get("kl_buckets"), _at(rec_path, "kl_buckets"))
                for name, v in buckets.items():
                    self.number(v, _at(_at(rec_path, "kl_buckets"), name))

    def strategy(self, s: dict[str, Any], path: str) -> None:
        layers_path = _at(path, "layers")
        for j, layer in enumerate(self.array(s.get("layers"), layers_path)):
            layer_path = _at(layers_path, j)
            layer = self.obj(layer, layer_path, null=False)
            for phase in PHASES:
                choice_path = _at(layer_path, phase)
                choice = self.obj(layer.get(phase), choice_path, null=False)
                if "head_groups" in choice:  # a layer split into head groups (strategy version 2)
                    groups_path = _at(choice_path, "head_groups")
                    for g, group in enumerate(self.array(choice.get("head_groups"), groups_path)):
                        group = self.obj(group, _at(groups_path, g), null=False)
                        self.string(group.get("pattern"), _at(_at(groups_path, g), "pattern"), null=False)
                        self.number(group.get("budget"), _at(_at(groups_path, g), "budget"))
                    continue
                self.string(choice.get("pattern"), _at(choice_path, "pattern"), null=False)
                self.number(choice.get("budget"), _at(choice_path, "budget"))
        prov_path = _at(path, "provenance")
        prov = self.obj(s.get("provenance"), prov_path)
        self.string(prov.get("pattern"), _at(prov_path, "pattern"))
        settings = self.obj(prov.get("settings"), _at(prov_path, "settings"))
        self.string(settings.get("pattern"), _at(_at(prov_path, "settings"), "pattern"))
