"""lm-eval tasks in a ``polykv-search score`` run (``--lm-eval-tasks T1,T2``), folded into the results file.

Every entry of the run is evaluated by lm-evaluation-harness through the ``polykv`` model
(:mod:`~polykv_search.integrations.lm_eval_model`) on the same requests: the same tasks, the same
first ``limit`` documents, the same few-shot seed. Each lm-eval task becomes a task ``lm-eval/T`` of
suite ``lm-eval`` in the results file, with one per-sample record per document (its id is lm-eval's
``doc_id``; its score is the task's per-document metric × 100, like the built-in 0-100 scores; its KV
bytes are the mean over the document's requests), so ``polykv-search compare`` pairs entries and
gives intervals on lm-eval tasks as on the built-in ones.

The score metric of a task is its first metric under its first filter (``T:METRIC`` picks another).
A metric that is not a mean over documents (perplexities, corpus BLEU) or that is lower-is-better is
refused in one line: compare's intervals and ▲/▼ need per-document, higher-is-better scores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lm_eval
from lm_eval.tasks import TaskManager

from polykv_search.integrations.lm_eval_model import PolyKVLM
from polykv_search.integrations.lm_eval_support import LMEvalError
from polykv_search.scoring.entries import Entry

SUITE = "lm-eval"
PREFIX = "lm-eval/"


@dataclass
class LMEvalRequest:
    """What every entry runs through lm-eval.

    Attributes
    ----------
    tasks
        lm-eval task, group or tag names.
    metrics
        Task -> the per-document metric to score it by (default: its first).
    include_path
        Folder of extra task YAMLs (lm-eval's ``--include_path``).
    limit
        Documents per task (lm-eval's ``--limit``; the run's ``--samples``).
    """

    tasks: list[str]
    metrics: dict[str, str] = field(default_factory=dict)
    include_path: str | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    task_manager: Any = None

    def provenance(self) -> dict[str, Any]:
        return {
            "version": lm_eval.__version__,
            "tasks": list(self.tasks),
            "metrics": dict(self.metrics),
            "include_path": self.include_path,
            "limit": self.limit,
            "num_fewshot": self.num_fewshot,
            "score": "per-document metric x 100; KV bytes: mean over a document's requests",
        }


def parse_request(
    spec: str, *, include_path: str | None = None, limit: int | None = None, num_fewshot: int | None = None
) -> LMEvalRequest:
    """Check ``T1,T2[:METRIC]`` against lm-eval's task index before any model is loaded.

    The built-in index (thousands of YAMLs, seconds to scan) is only built when some name is not
    found under ``include_path`` alone.
    """
    tasks: list[str] = []
    metrics: dict[str, str] = {}
    for item in (i.strip() for i in spec.split(",")):
        if not item:
            raise LMEvalError(f"--lm-eval-tasks: empty task name in {spec!r}")
        name, _, metric = item.partition(":")
        if name in tasks:
            continue
        tasks.append(name)
        if metric:
            metrics[name] = metric
    if include_path is not None and not Path(include_path).is_dir():
        raise LMEvalError(f"--lm-eval-include-path {include_path}: not a folder")
    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or any(t not in manager.all_tasks for t in tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = f" (built-in tasks and {include_path})" if include_path else " (see `lm-eval ls tasks`)"
        raise LMEvalError(f"--lm-eval-tasks: unknown lm-eval task {', '.join(unknown)}{where}")
    return LMEvalRequest(tasks, metrics, include_path, limit, num_fewshot, manager)


def run_entries(
    model,
    tokenizer,
    entries: Sequence[Entry],
    request: LMEvalRequest,
    *,
    decode_interval: int = 1,
    console=None,
) -> list[dict[str, Any]]:
    """Evaluate every entry on ``request`` through the ``polykv`` model; one lm-eval result per entry
    (its ``samples`` logged, its ``config.polykv`` block holding the KV bytes)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed} requests"),
        TimeElapsedColumn(),
    ]
    runs = []
    with Progress(*columns, console=console, disable=console is None) as bar:
        for i, entry in enumerate(entries):
            job = bar.add_task(f"lm-eval {i + 1}/{len(entries)}: {entry.name}", total=None)
            runs.append(
                run_entry(
                    model,
                    tokenizer,
                    entry,
                    request,
                    decode_interval=decode_interval,
                    on_request=lambda: bar.advance(job),
                )
            )
            bar.update(job, total=bar.tasks[job].completed)
    return runs


def run_entry(
    model,
    tokenizer,
    entry: Entry,
    request: LMEvalRequest,
    *,
    decode_interval: int = 1,
    on_request: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One entry through ``lm_eval.simple_evaluate`` (samples logged, no bootstrap: compare does its own)."""
    lm = PolyKVLM(pretrained=model, tokenizer=tokenizer, strategy=entry.strategy, decode_interval=decode_interval)
    lm.strategy_name = entry.name
    lm.show_progress, lm.on_request = False, on_request
    with quiet_lm_eval():
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(request.tasks),
            task_manager=request.task_manager,
            limit=request.limit,
            num_fewshot=request.num_fewshot,
            log_samples=True,
            bootstrap_iters=0,
        )
    return {"results": results, "kv_log": list(lm.kv_log)}


@contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """lm-eval's log lines (below errors) and tqdm bars off while ``score`` drives it (its own bar shows progress)."""
    logger = logging.getLogger("lm_eval")
    level, tqdm_flag = logger.level, os.environ.get("TQDM_DISABLE")
    logger.setLevel(logging.ERROR)
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        logger.setLevel(level)
        if tqdm_flag is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = tqdm_flag


# ----------------------------------------------------------------------------- folding
def fold(doc: dict[str, Any], runs: Sequence[dict[str, Any]], request: LMEvalRequest) -> None:
    """Add every lm-eval task of ``runs`` (one per entry of ``doc``, in order) to the results document."""
    prov_tasks = doc["provenance"].setdefault("tasks", {})
    fingerprints: dict[str, str] = {}
    for entry, run in zip(doc["entries"], runs, strict=True):
        results = run["results"]
        scores: list[float] = []
        for task in sorted(results.get("samples", {})):
            name = PREFIX + task
            folded = fold_task(task, results, run["kv_log"], request.metrics.get(task))
            fp = folded["meta"]["samples_fingerprint"]
            if fingerprints.setdefault(name, fp) != fp:
                raise LMEvalError(f"lm-eval task {task}: entries saw different documents (internal error)")
            prov_tasks[name] = {"version": str(results.get("versions", {}).get(task)), "suite": SUITE, "samples": fp}
            entry.setdefault("tasks", {})[name] = folded
            entry.setdefault("scores", {})[name] = folded["score"]
            entry.setdefault("extra", {})[name] = folded["extra"]
            scores.append(folded["score"])
        if scores:
            entry.setdefault("suites", {})[SUITE] = sum(scores) / len(scores)
        summary = results.get("config", {}).get("polykv", {})
        if entry.get("kv_bytes") is None and summary.get("requests"):
            entry["kv_bytes"], entry["full_kv_bytes"], entry["kv_ratio"] = (
                summary["kv_bytes"],
                summary["full_kv_bytes"],
                summary["kv_ratio"],
            )
        entry["lm_eval"] = _plain({"results": results.get("results", {}), "polykv": summary})
    # a request's prompt (its question included) is compressed whole, whatever the run's protocol
    doc["provenance"]["lm_eval"] = {**request.provenance(), "protocol": "question-aware"}


def fold_task(task: str, results: dict[str, Any], kv_log: Sequence[Any], metric: str | None = None) -> dict[str, Any]:
    """One lm-eval task of one entry as a task result of the results file (``TaskResult.to_dict`` layout)."""
    samples = results["samples"][task]
    if not samples:
        raise LMEvalError(f"lm-eval task {task}: no documents were evaluated")
    filt = samples[0].get("filter", "none")
    metric = metric or (samples[0].get("metrics") or [None])[0]
    rows = sorted((s for s in samples if s.get("filter", "none") == filt), key=lambda s: s["doc_id"])
    if metric is None or any(metric not in s for s in rows):
        known = ", ".join(samples[0].get("metrics") or []) or "none"
        raise LMEvalError(f"lm-eval task {task}: no per-document metric {metric!r} (it has: {known})")
    values = [_value(task, metric, s[metric]) for s in rows]
    mean = sum(values) / len(values)
    reported = results.get("results", {}).get(task, {}).get(f"{metric},{filt}")
    if isinstance(reported, (int, float)) and not math.isclose(reported, mean, rel_tol=1e-6, abs_tol=1e-9):
        raise LMEvalError(
            f"lm-eval task {task}: metric {metric} is not a mean over documents; pick one with {task}:METRIC"
        )
    if results.get("higher_is_better", {}).get(task, {}).get(metric) is False:
        raise LMEvalError(
            f"lm-eval task {task}: metric {metric} is lower-is-better; pick a higher-is-better one with {task}:METRIC"
        )
    kv = _kv_per_doc(task, kv_log)
    records = []
    for s, v in zip(rows, values):
        held, full = kv.get(s["doc_id"], (None, None))
        records.append(
            {
                "id": str(s["doc_id"]),
                "prediction": _plain(s.get("filtered_resps")),
                "answers": [_plain(s.get("target"))],
                "score": 100.0 * v,
                "kv_bytes": held,
                "full_kv_bytes": full,
                "doc_hash": s.get("doc_hash"),
            }
        )
    fp = hashlib.sha256(json.dumps([[r["id"], r["doc_hash"]] for r in records]).encode()).hexdigest()[:16]
    held = [r["kv_bytes"] for r in records if r["kv_bytes"] is not None]
    full = [r["full_kv_bytes"] for r in records if r["full_kv_bytes"] is not None]
    extra = {}
    if held and full:
        extra = {"kv_bytes": sum(held) / len(held), "kv_ratio": sum(held) / sum(full)}
    cfg = results.get("configs", {}).get(task, {})
    return {
        "task": PREFIX + task,
        "suite": SUITE,
        "score": 100.0 * mean,
        "n_samples": len(records),
        "predictions": [r["prediction"] for r in records],
        "per_sample": records,
        "extra": extra,
        "timing": {},
        "meta": {
            "name": PREFIX + task,
            "suite": SUITE,
            "lm_eval_task": task,
            "metric": metric,
            "filter": filt,
            "output_type": cfg.get("output_type"),
            "num_fewshot": results.get("n-shot", {}).get(task),
            "version": str(results.get("versions", {}).get(task)),
            "samples_fingerprint": fp,
        },
    }


def _value(task: str, metric: str, v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        raise LMEvalError(
            f"lm-eval task {task}: metric {metric} has no per-document number (got {type(v).__name__}); "
            f"pick one with {task}:METRIC"
        )
    return float(v)


def _kv_per_doc(task: str, kv_log: Sequence[Any]) -> dict[int, tuple[float, float]]:
    """Mean KV bytes held (and FullKV's) over each document's requests."""
    sums: dict[int, list[float]] = {}
    for r in kv_log:
        if r.task == task and r.doc_id is not None:
            acc = sums.setdefault(r.doc_id, [0.0, 0.0, 0])
            acc[0] += r.kv_bytes
            acc[1] += r.full_kv_bytes
            acc[2] += 1
    return {d: (a[0] / a[2], a[1] / a[2]) for d, a in sums.items()}


def _plain(v: Any) -> Any:
    """``v`` as strict JSON: tuples as lists, non-finite floats as null, other objects as strings."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or isinstance(v, (str, int, bool)):
        return v
    return str(v)
