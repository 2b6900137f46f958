"""Scoring a trial's strategy: the calibration evaluator and the normalization of evaluator answers."""

from __future__ import annotations

import copy
import math
import queue
from collections.abc import Callable
from typing import Any

from polykv_search import scoring
from polykv_search.data import DataError, describe_split, load_corpus, split_corpus
from polykv_search.evaluation import samples_fingerprint
from polykv_search.models import DEFAULT_MODEL, ModelError, load_model, model_fingerprint
from solvers.base import Problem, SolverError
from solvers.optuna_settings import OptunaSettings
from solvers.optuna_study import first_line
from strategies import PHASES

Evaluator = Callable[[Any], Any]


def values_of(out: Any, two: bool, strategy) -> tuple[tuple[float, ...], dict[str, Any]]:
    """Normalize an evaluator's answer to objective values (+ extra trial attributes)."""
    extra: dict[str, Any] = {}
    memory = None
    quality: Any
    if isinstance(out, dict):
        quality = out.get("quality")
        memory = out.get("memory")
        extra = {k: v for k, v in out.items() if k not in ("quality", "memory")}
    elif isinstance(out, (tuple, list)):
        if len(out) not in (1, 2):
            raise SolverError(f"evaluator: expected quality or (quality, memory), got {len(out)} values")
        quality = out[0]
        memory = out[1] if len(out) == 2 else None
    else:
        quality = out
    try:
        quality = float(quality)
    except (TypeError, ValueError):
        raise SolverError(f"evaluator: quality must be a number, got {quality!r}") from None
    if not math.isfinite(quality):
        raise SolverError(f"evaluator: quality is not finite ({quality})")
    if not two:
        return (quality,), extra
    if memory is None:  # fallback: KV tokens held, mean over layers and phases
        memory = sum(c.budget for phase in PHASES for c in strategy.phase(phase)) / (len(PHASES) * strategy.num_layers)
        extra["memory_unit"] = "kv_tokens"
    return (quality, float(memory)), extra


class CalibrationEvaluator:
    """Scores a strategy on calibration samples with :func:`polykv_search.scoring.score_entry`.

    Thread safe: each call borrows one model from a pool (``copies`` deep copies of ``model``,
    made up front), because a model runs one strategy at a time."""

    def __init__(self, model, tokenizer, task_samples: dict, metric: str, copies: int = 1):
        self.tokenizer = tokenizer
        self.task_samples = task_samples
        self.metric = metric
        self._pool: queue.Queue = queue.Queue()
        self._pool.put(model)
        for _ in range(max(0, copies - 1)):
            self._pool.put(copy.deepcopy(model))

    def __call__(self, strategy) -> dict[str, Any]:
        model = self._pool.get()
        try:
            rec = scoring.score_entry(
                model, self.tokenizer, scoring.Entry("trial", strategy, "strategy", "optuna"), self.task_samples
            )
        finally:
            self._pool.put(model)
        scores = rec["scores"]
        if self.metric == "score":
            quality = sum(scores.values()) / len(scores)
        else:
            logs = [math.log(e["ppl"]) for e in rec["extra"].values() if "ppl" in e and e["ppl"] > 0]
            if not logs:
                raise SolverError("metric log-ppl: no task reported a perplexity (use teacher-forced tasks)")
            quality = -sum(logs) / len(logs)
        return {
            "quality": quality,
            "memory": float(rec["kv_bytes"]),
            "scores": scores,
            "kv_ratio": rec["kv_ratio"],
            "seconds": rec["seconds"],
            "memory_unit": "kv_bytes",
        }


def calibration_evaluator(
    s: OptunaSettings, problem: Problem, loaded_model=None
) -> tuple[CalibrationEvaluator, dict[str, Any]]:
    """The runtime evaluator on calibration samples of ``s.tasks`` (the calibration split of
    ``s.corpus``) and the description of those samples for the study's configuration."""
    try:
        tasks = scoring.resolve_tasks(s.tasks)
    except scoring.ScoreError as err:
        raise SolverError(f"tasks: {err}") from None
    if s.metric == "log-ppl" and not any(getattr(t, "kind", "") == "teacher_forced" for t in tasks):
        raise SolverError(f"metric log-ppl: none of the tasks {s.tasks!r} is teacher-forced (try broad/continuation)")
    try:
        corpus = load_corpus(s.corpus)
        texts = [d.text for d in split_corpus(corpus, "calib")]
        split = describe_split(corpus, "calib")
    except DataError as err:
        raise SolverError(f"corpus: {err}") from None
    if loaded_model is not None:
        model, tok = loaded_model
        model_name = getattr(model.config, "name_or_path", "") or "loaded"
    else:
        table = problem.table
        model_name = s.model or (table.provenance.get("model") if table is not None else None) or DEFAULT_MODEL
        try:
            model, tok = load_model(model_name, device=s.device, dtype=s.dtype)
        except (ModelError, ValueError) as err:
            raise SolverError(f"model: {first_line(err)}") from None
    L = int(model.config.num_hidden_layers)
    if L != problem.num_layers:
        raise SolverError(f"model: {model_name!r} has {L} layers but the problem has {problem.num_layers}")
    try:
        task_samples = scoring.make_task_samples(
            tok, tasks, texts, n_samples=s.samples, context_len=s.context_len, seed=s.seed
        )
    except ValueError as err:
        raise SolverError(f"calibration samples: {first_line(err)}") from None
    calib = {
        "model": str(model_name),
        "model_fingerprint": model_fingerprint(model),
        "split": split,
        "tasks": {n: samples_fingerprint(smp) for n, (_, smp) in task_samples.items()},
        "samples": s.samples,
        "context_len": s.context_len,
        "seed": s.seed,
        "metric": s.metric,
    }
    return CalibrationEvaluator(model, tok, task_samples, s.metric, copies=s.jobs), calib
