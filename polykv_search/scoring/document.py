"""The results file of ``polykv-search score`` (schema ``polykv-results``).

Version 2 (this one) adds to version 1: per-sample fidelity of teacher-forced tasks (``kl``: mean
per-token KL(FullKV ‖ entry), ``dnll``: mean per-token NLL_entry − NLL_FullKV, both nats, in
``tasks[T].per_sample[i]`` and their means in ``extra[T]``), ``provenance.engine`` (``shared``: one
FullKV context pass per sample, entries batched; ``per-entry``: every entry runs every sample
alone) and ``provenance.timing``. An entry's ``seconds`` is null under the shared engine (entries
are not timed apart). Every task keeps its per-sample scores, so every comparison can be paired.
``provenance.protocol`` (optional within version 2) is ``question-agnostic`` or ``question-aware``
(:mod:`polykv_search.protocol`); a file without it is question-agnostic, and files of different
protocols are never paired. Under ``question-aware`` a record's ``context_tokens`` counts the whole
compressed prompt and ``question_tokens`` is 0. ``provenance.execution`` (optional) says how the run was
executed: ``jobs``, ``backend`` (``in-process``, ``loky``, ``dask``, ``ray``, ``sequential``) and intra-op
``threads`` per process (null: a cluster worker's own); like the timing, it never changes a score.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from typing import Any

import polykv_search
from polykv_search.evaluation import TaskResult, samples_fingerprint, suite_scores
from polykv_search.protocol import AGNOSTIC, check_protocol
from polykv_search.scoring.entries import Entry

RESULTS_SCHEMA = "polykv-results"
RESULTS_VERSION = 2
#: versions a reader of this code understands
READABLE_VERSIONS = (1, 2)


def entry_record(
    entry: Entry,
    results: Sequence[TaskResult],
    kv_bytes: Sequence[float],
    full_kv_bytes: Sequence[float],
    seconds: float | None,
) -> dict[str, Any]:
    """An entry's record: scores per task and suite, fidelity, KV bytes held, per-sample records."""
    kv, full = _mean(kv_bytes), _mean(full_kv_bytes)
    return {
        "name": entry.name,
        "kind": entry.kind,
        "source": entry.source,
        "strategy_digest": entry.strategy.digest(),
        "global_budget": entry.strategy.global_budget,
        "solver": entry.strategy.provenance.get("solver"),
        "strategy": entry.strategy.to_json(),
        "scores": {r.task: r.score for r in results},
        "suites": suite_scores(results),
        "extra": {r.task: r.extra for r in results if r.extra},
        "kv_bytes": kv,
        "full_kv_bytes": full,
        "kv_ratio": kv / full if kv is not None and full else None,
        "seconds": seconds,
        "tasks": {r.task: r.to_dict() for r in results},
    }


def results_document(
    entries: list[dict[str, Any]],
    *,
    model_name: str,
    model_fp: str,
    task_samples: dict[str, tuple[Any, list]],
    settings: dict[str, Any],
    split: dict[str, Any],
    engine: str = "shared",
    timing: dict[str, float] | None = None,
    protocol: str = AGNOSTIC,
    execution: dict[str, Any] | None = None,
) -> dict[str, Any]:
    tasks = {
        n: {"version": t.version, "suite": t.suite, "samples": samples_fingerprint(s)}
        for n, (t, s) in task_samples.items()
    }
    return {
        "schema": RESULTS_SCHEMA,
        "version": RESULTS_VERSION,
        "provenance": {
            "model": model_name,
            "model_fingerprint": model_fp,
            "settings": settings,
            "eval_split": split,
            "tasks": tasks,
            "engine": engine,
            "protocol": check_protocol(protocol),
            "timing": dict(timing or {}),
            "execution": dict(execution or {}),
            "code_version": polykv_search.__version__,
            "python": platform.python_version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "entries": entries,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
