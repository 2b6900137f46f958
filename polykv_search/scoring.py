"""Score strategies and baselines on the same generated samples with the same runtime.

The library side of ``polykv-search score`` (also used by the Optuna solver and quickstart):
samples are generated once per task from the evaluation split of a corpus, and every entry runs
them through :func:`~polykv_search.runtime.apply_strategy`.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import polykv_search
from polykv_search.evaluation import TaskResult, run_task, suite_scores, tasks_for
from polykv_search.runtime import apply_strategy
from strategies import Strategy

RESULTS_SCHEMA = "polykv-results"
RESULTS_VERSION = 1
BASELINE_SPECS = "full | uniform:PATTERN | pyramid[:PATTERN]"


class ScoreError(ValueError):
    """Bad scoring input (unknown baseline, missing budget, ...)."""


@dataclass
class Entry:
    """One thing to score: a strategy with a display name."""

    name: str
    strategy: Strategy
    kind: str  # "baseline" or "strategy"
    source: str


def baseline(spec: str, num_layers: int, budget: float | None, b_min: int = 1) -> Entry:
    """Build a baseline entry from ``full``, ``uniform:PATTERN`` or ``pyramid[:PATTERN]``."""
    name, _, arg = spec.partition(":")
    if name == "full":
        return Entry("full", Strategy.full(num_layers), "baseline", spec)
    if budget is None:
        raise ScoreError(f"baseline {spec!r} needs --budget")
    from solvers import Problem, get_solver

    problem = Problem(global_budget=budget, num_layers=num_layers, b_min=min(b_min, int(budget)))
    if name == "uniform":
        if not arg:
            raise ScoreError("baseline 'uniform' needs a pattern: uniform:snapkv")
        strategy = get_solver("uniform", pattern=arg).solve(problem).strategy
        return Entry(f"uniform-{arg}", strategy, "baseline", spec)
    if name == "pyramid":
        settings = {"pattern": arg} if arg else {}
        strategy = get_solver("pyramid", **settings).solve(problem).strategy
        return Entry(f"pyramid-{arg}" if arg else "pyramid", strategy, "baseline", spec)
    raise ScoreError(f"unknown baseline {spec!r}; expected {BASELINE_SPECS}")


def eval_texts(corpus_spec: str) -> tuple[list[str], dict[str, Any]]:
    """Haystack texts from the evaluation split (never the calibration documents)."""
    from polykv_search.data import describe_split, load_corpus, split_corpus

    corpus = load_corpus(corpus_spec)
    return [d.text for d in split_corpus(corpus, "eval")], describe_split(corpus, "eval")


def make_task_samples(
    tokenizer, tasks: Sequence[Any], texts: Sequence[str], *, n_samples: int, context_len: int, seed: int
) -> dict[str, tuple[Any, list]]:
    """``{task name: (task, samples)}``, generated once and shared by every entry."""
    return {
        task.name: (task, task.generate(tokenizer, texts, n_samples, context_len, seed + i))
        for i, task in enumerate(tasks)
    }


def score_entry(
    model,
    tokenizer,
    entry: Entry,
    task_samples: dict[str, tuple[Any, list]],
    *,
    decode_interval: int = 1,
    max_new_tokens: int | None = None,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run every task on ``entry``; returns the entry's record for the results file."""
    kv: list[int] = []
    full_kv: list[int] = []

    def record_kv(rt, sample, record):
        report = rt.report()
        record["kv_bytes"], record["full_kv_bytes"] = report.kv_bytes, report.full_kv_bytes
        kv.append(report.kv_bytes)
        full_kv.append(report.full_kv_bytes)

    results: list[TaskResult] = []
    start = time.perf_counter()
    for name, (task, samples) in task_samples.items():
        results.append(
            run_task(
                model,
                tokenizer,
                task,
                samples,
                runner=lambda: apply_strategy(model, entry.strategy, decode_interval=decode_interval),
                max_new_tokens=max_new_tokens,
                progress=(lambda done, total: progress()) if progress else None,
                on_sample=record_kv,
            )
        )
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
        "kv_bytes": _mean(kv),
        "full_kv_bytes": _mean(full_kv),
        "kv_ratio": _mean(kv) / _mean(full_kv) if full_kv and _mean(full_kv) else None,
        "seconds": time.perf_counter() - start,
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
) -> dict[str, Any]:
    from polykv_search.evaluation import samples_fingerprint

    return {
        "schema": RESULTS_SCHEMA,
        "version": RESULTS_VERSION,
        "provenance": {
            "model": model_name,
            "model_fingerprint": model_fp,
            "settings": settings,
            "eval_split": split,
            "tasks": {n: {"version": t.version, "suite": t.suite, "samples": samples_fingerprint(s)} for n, (t, s) in task_samples.items()},
            "code_version": polykv_search.__version__,
            "python": platform.python_version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "entries": entries,
    }


def resolve_tasks(spec: str, longbench_source: str | None = None) -> list[Any]:
    """Task objects from ``broad,ruler`` or explicit task names (``ruler/vt``)."""
    options = {"longbench": {"source": longbench_source}} if longbench_source else {}
    try:
        return tasks_for(spec, **options)
    except (KeyError, ValueError, TypeError) as err:
        raise ScoreError(str(err).strip("'\"")) from None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
