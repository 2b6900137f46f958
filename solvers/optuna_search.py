"""``optuna``: search the parameters of an allocation rule, scoring every trial with the runtime.

Every trial builds a strategy that is feasible by construction (budgets from
:func:`~solvers.base.allocate`, the ``ilp`` solver, or ``floor(B)``) and scores it by running the
runtime on **calibration** samples (the calibration split of ``corpus``, never the evaluation
split) with the scoring code of ``polykv-search score`` (:func:`polykv_search.scoring.score_entry`).

Search space (a categorical ``family`` with conditional parameters)
    ``rule`` (``space="rule"``): the paper's rule with four continuous knobs. Per (layer, phase)
    and allowed pattern, at the reference budget (grid value closest to B):

    * pattern = argmax of ``alpha·u_cos + (1 − alpha)·u_ppl``, where ``u_cos`` / ``u_ppl`` are the
      pattern's rank among the layer's patterns by cosine (higher is better) / by ΔPPL (lower is
      better), scaled to [0, 1] (a missing cell ranks −1; ties to the pattern listed first);
    * sensitivity ``s = beta·entropy/max(entropy) + (1 − beta)·w/max(w)`` with ``w`` the worst-case
      ΔPPL over the allowed patterns (negative values count as 0; at ``beta`` = 1 or 0 the raw
      signal is used);
    * budgets ``allocate(T, weights=s**gamma, base=b_min + floor_share·(B − b_min), lo=b_min,
      hi=max_budget)``: every layer first gets a floor between b_min and B, the rest is shared
      in proportion to ``s**gamma`` (``gamma`` in [0, 3]), with Σ = ``floor(L·B)`` exactly.

    ``(alpha, beta, gamma, floor_share) = (1, 1, 1, 0)`` is exactly ``proportional`` (cosine
    preference, entropy sensitivity).

    ``per-layer`` (``space="per-layer"``, the ablation): a categorical pattern per (layer, phase)
    and the same budget shape (``beta``, ``gamma``, ``floor_share``).

    ``ilp``: the ``ilp`` solver with ``ilp_objective`` ∈ {dppl, 1-cosine}.
    ``uniform``: one pattern (``uniform_pattern``) at ``floor(B)`` in every layer.

Anchors
    The first trials are enqueued (``enqueue_trial(..., skip_if_exists=True)``, so a resumed study
    does not repeat them): ``proportional`` (the rule at (1, 1, 1, 0)), ``ilp`` (ΔPPL objective)
    and ``uniform-best`` (the allowed pattern with the lowest predicted ΔPPL of the uniform strategy
    at B in the table). The best trial is therefore never worse than the best anchor.

Objectives
    ``quality`` (maximized): the mean task score (0–100) of ``tasks`` on the calibration samples
    (``metric="score"``), or ``−mean log perplexity`` of the teacher-forced tasks
    (``metric="log-ppl"``, a continuous signal). ``quality,memory`` adds the KV bytes the runtime
    holds per sample (minimized); trials then also choose the budget ``budget`` ∈
    [``max(b_min, min_budget_share·B)``, B] (the phases that are not optimized get ``floor`` of it
    too), and the result lists the Pareto front; :func:`front_strategies` gives one strategy per
    front point (its ``global_budget`` is the point's budget, ``budget_cap`` is B).

Storage and workers
    ``trials`` is the number of strategies the **study** should score with the runtime (anchors,
    earlier runs and other workers included): a killed study resumes from its storage and runs
    only what is missing. A trial that lands on a strategy already scored (e.g. the ``ilp`` family
    again) reuses its values, costs no runtime and does not count (``cached`` in its user
    attributes); a study stops after ``4·trials`` trials in all even so. ``storage`` defaults to a journal file ``<cache>/optuna/<study_name>.journal``; a path
    is a journal file too, ``memory`` keeps the study in memory, and any optuna RDB URL
    (``sqlite:///s.db``, ``postgresql://...``) lets several workers (``polykv-search solve`` on
    several machines with the same ``--storage`` and ``--study-name``) share one study. The default
    study name is a hash of everything that determines a trial's value, and a study created for a
    different problem or settings is refused. ``jobs`` runs trials in threads (each thread scores
    on its own copy of the model).

Samplers (explicit, since optuna 5.0 changed the defaults): one objective →
``TPESampler(seed, n_startup_trials=startup_trials, multivariate=True, group=True,
constant_liar=True, n_ei_candidates=24)``; two objectives → the same TPE (``mo_sampler="tpe"``) or
``NSGAIISampler(population_size=population, seed, crossover_prob=0.9, swapping_prob=0.5)``
(``mo_sampler="nsga2"``). Both are recorded in the strategy's provenance.

Tests inject ``evaluator=`` (a callable ``Strategy -> quality`` or ``(quality, memory)`` or a dict
with those keys) or ``loaded_model=(model, tokenizer)`` as constructor keywords.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import queue
import re
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from solvers.base import (
    OBJECTIVES,
    Choice,
    Plan,
    Problem,
    Settings,
    SolveResult,
    Solver,
    SolverError,
    _jsonable,
    allocate,
    predict_degradation,
    setting,
)
from strategies.strategy import PHASES

FAMILIES_RULE = ("rule", "ilp", "uniform")
FAMILIES_LAYERS = ("per-layer", "ilp", "uniform")
ILP_OBJECTIVES = ("dppl", "1-cosine")
GAMMA_MAX = 3.0
FLOOR_SHARE_MAX = 0.9
#: The proportional anchor's rule parameters.
#: A study stops after MAX_TRIALS_FACTOR * trials finished trials even if repeats kept it short of
#: ``trials`` scored strategies.
MAX_TRIALS_FACTOR = 4
PROPORTIONAL_POINT = {"alpha": 1.0, "beta": 1.0, "gamma": 1.0, "floor_share": 0.0}


@dataclass(frozen=True)
class OptunaSettings(Settings):
    trials: int = setting(40, "strategies the study should score (anchors and earlier runs count; repeats are free)")
    storage: str | None = setting(
        None, "optuna storage: journal file path, 'memory', or an RDB URL (default: <cache>/optuna/<study>.journal)"
    )
    jobs: int = setting(1, "trials run in parallel threads (n_jobs); each thread uses its own model copy")
    study_name: str | None = setting(None, "study name (default: a hash of the problem and settings, so a rerun resumes)")
    seed: int = setting(0, "sampler seed and calibration sample seed")
    objectives: str = setting("quality", "objectives: quality, or quality,memory for a Pareto front", ("quality", "quality,memory"))
    space: str = setting("rule", "search space: allocation-rule parameters, or per-layer patterns (ablation)", ("rule", "per-layer"))
    model: str | None = setting(None, "model that scores trials (default: the signal table's model)")
    device: str = setting("cpu", "device of the scoring model")
    dtype: str = setting("float32", "dtype of the scoring model")
    samples: int = setting(8, "calibration samples per task")
    context_len: int = setting(1024, "prompt length in tokens of the calibration samples")
    corpus: str = setting("austen", "corpus spec; its calibration split is used")
    tasks: str = setting("broad/continuation", "tasks scored per trial, comma separated (suite or task names)")
    metric: str = setting("score", "quality: mean task score, or -mean log perplexity of teacher-forced tasks", ("score", "log-ppl"))
    startup_trials: int = setting(10, "random trials before TPE models the space (anchors count)")
    mo_sampler: str = setting("tpe", "sampler for quality,memory: multi-objective TPE or NSGA-II", ("tpe", "nsga2"))
    population: int = setting(16, "NSGA-II population size")
    min_budget_share: float = setting(0.25, "quality,memory: the smallest budget tried, as a share of B")
    verbose: bool = setting(False, "show optuna's per-trial log")

    def check(self) -> None:
        for name, low in (("trials", 1), ("jobs", 1), ("samples", 1), ("context_len", 8), ("startup_trials", 0), ("population", 2)):
            value = getattr(self, name)
            if value < low:
                raise SolverError(f"{name}: must be >= {low}, got {value}")
        if not 0 < self.min_budget_share <= 1:
            raise SolverError(f"min_budget_share: must be in (0, 1], got {self.min_budget_share:g}")
        if self.storage is not None and not self.storage.strip():
            raise SolverError("storage: empty; give a journal file path, 'memory' or an RDB URL")
        if self.study_name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.study_name):
            raise SolverError(f"study_name: use letters, digits, '.', '_' and '-' only, got {self.study_name!r}")
        if not [t for t in self.tasks.split(",") if t.strip()]:
            raise SolverError("tasks: no task given")
        if self.model is not None and not self.model.strip():
            raise SolverError("model: empty")

    @property
    def two_objectives(self) -> bool:
        return self.objectives == "quality,memory"


# ============================================================================ evaluation
Evaluator = Callable[[Any], Any]


def _values_of(out: Any, two: bool, strategy) -> tuple[tuple[float, ...], dict[str, Any]]:
    """Normalize an evaluator's answer to objective values (+ extra trial attributes)."""
    extra: dict[str, Any] = {}
    memory = None
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
        memory = sum(c.budget for phase in ("prefill", "decoding") for c in strategy.phase(phase)) / (2 * strategy.num_layers)
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
        from polykv_search import scoring

        model = self._pool.get()
        try:
            rec = scoring.score_entry(model, self.tokenizer, scoring.Entry("trial", strategy, "strategy", "optuna"), self.task_samples)
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


# ============================================================================ trial building
class _Signals:
    """Per (phase, reference budget): pattern preference ranks and the two sensitivities."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.table = problem.require_table("optuna")
        self.pidx = problem.pattern_indices()
        self.names = [self.table.patterns[i] for i in self.pidx]
        self._cache: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        self.filled: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, phase: str, ref: int) -> dict[str, np.ndarray]:
        with self._lock:
            key = (phase, ref)
            if key not in self._cache:
                self._cache[key] = self._compute(phase, ref)
            return self._cache[key]

    def _compute(self, phase: str, ref: int) -> dict[str, np.ndarray]:
        t = self.table
        f, g = t.phase_index(phase), t.budget_index(ref)
        cos = t._cosine[:, f][:, self.pidx, g]  # noqa: SLF001  (L, P)
        dppl = t._dppl[:, f][:, self.pidx, g]  # noqa: SLF001
        entropy = _fill(t._entropy[:, f].astype(np.float64), 1.0)  # noqa: SLF001
        finite = np.isfinite(dppl)
        worst = np.where(finite.any(axis=1), np.where(finite, dppl, -np.inf).max(axis=1), np.nan)
        worst = _fill(worst, 0.0)
        self.filled[f"{phase}@{ref}"] = int((~np.isfinite(t._entropy[:, f])).sum() + (~finite.any(axis=1)).sum())  # noqa: SLF001
        return {"u_cos": _unit_rank(cos), "u_ppl": _unit_rank(-dppl), "entropy": entropy, "worst": worst}


def _fill(x: np.ndarray, default: float) -> np.ndarray:
    """Missing values -> the mean of the finite ones (``default`` if none is finite)."""
    x = np.asarray(x, dtype=np.float64).copy()
    bad = ~np.isfinite(x)
    if bad.any():
        x[bad] = float(x[~bad].mean()) if (~bad).any() else default
    return x


def _unit_rank(values: np.ndarray) -> np.ndarray:
    """Per row: rank of each finite value scaled to [0, 1] (higher value -> 1; ties share the mean
    rank; a single finite value -> 1); missing values -> −1."""
    out = np.full(values.shape, -1.0)
    for row in range(values.shape[0]):
        fin = np.isfinite(values[row])
        n = int(fin.sum())
        if n == 1:
            out[row, fin] = 1.0
        elif n > 1:
            out[row, fin] = (_average_ranks(values[row, fin]) - 1.0) / (n - 1.0)
    return out


def _average_ranks(v: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their mean rank (``scipy.stats.rankdata(method="average")``)."""
    n = v.size
    sorter = np.argsort(v, kind="mergesort")
    inv = np.empty(n, dtype=np.int64)
    inv[sorter] = np.arange(n)
    vs = v[sorter]
    first = np.r_[True, vs[1:] != vs[:-1]]
    dense = first.cumsum()[inv]
    bounds = np.r_[np.nonzero(first)[0], n]
    return 0.5 * (bounds[dense] + bounds[dense - 1] + 1)


def rule_patterns(sig: dict[str, np.ndarray], names: Sequence[str], alpha: float) -> list[str]:
    score = sig["u_cos"] if alpha == 1.0 else (sig["u_ppl"] if alpha == 0.0 else alpha * sig["u_cos"] + (1 - alpha) * sig["u_ppl"])
    return [names[int(np.argmax(row))] for row in score]  # first maximum = first listed pattern


def rule_budgets(sig: dict[str, np.ndarray], problem: Problem, beta: float, gamma: float, floor_share: float) -> list[int]:
    ent = np.maximum(sig["entropy"], 0.0)
    worst = np.maximum(sig["worst"], 0.0)
    if beta == 1.0:
        sens = ent
    elif beta == 0.0:
        sens = worst
    else:
        sens = beta * _unit_max(ent) + (1.0 - beta) * _unit_max(worst)
    weights = sens**gamma if gamma != 0 else np.ones_like(sens)
    base = problem.b_min + floor_share * max(0.0, problem.global_budget - problem.b_min)
    budgets = allocate(problem.total, weights=weights, base=base, lo=problem.b_min, hi=problem.max_budget)
    return [int(b) for b in budgets]


def _unit_max(x: np.ndarray) -> np.ndarray:
    m = float(x.max()) if x.size else 0.0
    return x / m if m > 0 else np.zeros_like(x)


def best_uniform_pattern(problem: Problem) -> tuple[str, float | None]:
    """The allowed pattern whose uniform strategy at ``floor(B)`` has the lowest predicted ΔPPL
    (1 − cosine if no ΔPPL is available; the first listed pattern if neither is)."""
    from strategies.strategy import LayerChoice, Strategy

    table = problem.require_table("optuna")
    b = problem.uniform_budget
    L = problem.num_layers
    for kind in ("dppl", "1-cosine"):
        scored = []
        for p in problem.patterns:
            s = Strategy([LayerChoice(p, b)] * L, [LayerChoice(p, b)] * L, problem.global_budget, problem.b_min)
            v = predict_degradation(table, s, problem.phases, kind)
            if v is not None:
                scored.append((v, p))
        if scored:
            v, p = min(scored, key=lambda t: t[0])  # min keeps the first listed on ties
            return p, float(v)
    return problem.patterns[0], None


def _pattern_param(phase: str, layer: int) -> str:
    return f"{phase}_pattern_{layer:03d}"


# ============================================================================ the solver
class OptunaSolver(Solver):
    name = "optuna"
    description = "Optuna search over allocation-rule parameters, trials scored by the runtime"
    needs_table = True
    Settings = OptunaSettings

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        evaluator: Evaluator | None = None,
        loaded_model: tuple[Any, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(settings, **kwargs)
        if evaluator is not None and loaded_model is not None:
            raise SolverError("give either evaluator= or loaded_model=, not both")
        if evaluator is not None and not callable(evaluator):
            raise SolverError("evaluator: must be callable (Strategy -> quality [, memory])")
        if loaded_model is not None and (not isinstance(loaded_model, (tuple, list)) or len(loaded_model) != 2):
            raise SolverError("loaded_model: expected (model, tokenizer)")
        self.evaluator = evaluator
        self.loaded_model = tuple(loaded_model) if loaded_model is not None else None
        self.study = None  # the optuna study of the last solve (for inspection)

    # --------------------------------------------------------------------- solve
    def solve(self, problem: Problem) -> SolveResult:
        result = super().solve(problem)
        info = result.info
        main = info.get("main_point")
        if main is not None and main.get("budget") != problem.global_budget:
            # two objectives: the chosen point has a smaller budget; rebuild it exactly as scored
            # (the phases that are not optimized get floor of the point's budget)
            strategy = _point_strategy(result.strategy, main, problem.global_budget)
            result.strategy = strategy
            table = problem.table
            result.predicted = {k: predict_degradation(table, strategy, problem.phases, k) for k in OBJECTIVES}
            result.choices = [
                Choice(l, phase, strategy.phase(phase)[l].pattern, strategy.phase(phase)[l].budget, phase in problem.phases)
                for phase in PHASES
                for l in range(problem.num_layers)
            ]
        return result

    def _solve(self, problem: Problem) -> Plan:
        optuna = _import_optuna()
        s = self.settings
        signals = _Signals(problem)
        uniform_best, uniform_pred = best_uniform_pattern(problem)
        evaluate, calib = self._make_evaluator(problem)
        config = self._study_config(problem, calib)
        study_name = s.study_name or "polykv-" + _digest(config)[:12]
        storage, storage_desc = _make_storage(optuna, s.storage, study_name)
        sampler, sampler_desc = self._make_sampler(optuna)
        two = s.two_objectives
        directions = ["maximize", "minimize"] if two else ["maximize"]

        previous = optuna.logging.get_verbosity()
        if not s.verbose:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            try:
                study = optuna.create_study(
                    storage=storage, sampler=sampler, study_name=study_name, directions=directions, load_if_exists=True
                )
            except Exception as err:  # noqa: BLE001 - storage errors come in many types
                raise SolverError(f"storage {storage_desc}: cannot open study {study_name!r} ({_first_line(err)})") from None
            self.study = study
            self._check_config(study, config, study_name, storage_desc)
            self._enqueue_anchors(study, problem, uniform_best)
            objective = self._objective(problem, signals, evaluate)
            scored, finished = _progress(study)
            cap = MAX_TRIALS_FACTOR * s.trials
            ran = 0
            if scored < s.trials and finished < cap:
                study.optimize(
                    objective,
                    n_trials=cap - finished,
                    n_jobs=s.jobs,
                    callbacks=[_StopWhenScored(s.trials, cap)],
                    catch=(),
                    gc_after_trial=False,
                )
                ran = _progress(study)[1] - finished
        finally:
            optuna.logging.set_verbosity(previous)

        complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            raise SolverError(f"optuna: study {study_name!r} has no finished trial")
        anchor_rows = [
            {"anchor": t.user_attrs["anchor"], "trial": t.number, "values": list(t.values), "family": t.params.get("family")}
            for t in complete
            if "anchor" in t.user_attrs
        ]
        front = []
        if two:
            front = _front(complete)
            best = max(front, key=lambda t: (t.values[0], -t.values[1], -t.number))
        else:
            best = max(complete, key=lambda t: (t.values[0], -t.number))  # ties -> earliest (anchors first)
        choices = {phase: [tuple(c) for c in best.user_attrs["choices"][phase]] for phase in problem.phases}
        best_row = _trial_row(best)
        front_rows = [_trial_row(t, with_choices=True) for t in front]
        provenance = {
            "optuna": {
                "study_name": study_name,
                "storage": storage_desc,
                "sampler": sampler_desc,
                "objectives": {"quality": "maximize", **({"memory": "minimize"} if two else {})},
                "quality": f"mean task score (0-100) of {s.tasks}" if s.metric == "score" else f"-mean log perplexity of {s.tasks}",
                "memory_unit": best.user_attrs.get("memory_unit") if two else None,
                "space": s.space,
                "families": list(FAMILIES_RULE if s.space == "rule" else FAMILIES_LAYERS),
                "strategies_scored": _progress(study)[0],
                "trials_complete": len(complete),
                "trials_total": len(study.trials),
                "trials_run_now": ran,
                "best": best_row,
                "anchors": anchor_rows,
                "uniform_best": {"pattern": uniform_best, "predicted_dppl": uniform_pred},
                "calibration": calib,
                "front": [{k: v for k, v in r.items() if k != "choices"} for r in front_rows] if two else None,
            }
        }
        anchor_best = max((a["values"][0] for a in anchor_rows), default=None)
        message = (
            f"best calibration quality {best.values[0]:.4g} (trial {best.number}, {best.params.get('family')}; "
            f"best anchor {'n/a' if anchor_best is None else f'{anchor_best:.4g}'}); "
            f"{_progress(study)[0]} strategies scored in {len(complete)} trials"
        )
        if two:
            message += f"; Pareto front of {len(front)} points"
        info = {
            "study_name": study_name,
            "storage": storage_desc,
            "best": best_row,
            "anchors": anchor_rows,
            "front": front_rows,
            "main_point": _trial_row(best, with_choices=True) if two else None,
            "signals_filled": dict(signals.filled),
        }
        return Plan(choices, objective=None, message=message, info=info, provenance=provenance)

    # ------------------------------------------------------------- components
    def _make_sampler(self, optuna) -> tuple[Any, dict[str, Any]]:
        s = self.settings
        from optuna.exceptions import ExperimentalWarning

        if s.two_objectives and s.mo_sampler == "nsga2":
            desc = {"class": "NSGAIISampler", "population_size": s.population, "seed": s.seed, "crossover_prob": 0.9, "swapping_prob": 0.5}
            return optuna.samplers.NSGAIISampler(population_size=s.population, seed=s.seed, crossover_prob=0.9, swapping_prob=0.5), desc
        desc = {
            "class": "TPESampler",
            "seed": s.seed,
            "n_startup_trials": s.startup_trials,
            "n_ei_candidates": 24,
            "multivariate": True,
            "group": True,
            "constant_liar": True,
            "optuna_version": optuna.__version__,
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=s.seed, n_startup_trials=s.startup_trials, n_ei_candidates=24, multivariate=True, group=True, constant_liar=True
            )
        return sampler, desc

    def _make_evaluator(self, problem: Problem) -> tuple[Callable[[Any], Any], dict[str, Any]]:
        s = self.settings
        if self.evaluator is not None:
            return self.evaluator, {"evaluator": getattr(self.evaluator, "__qualname__", type(self.evaluator).__name__)}
        from polykv_search import scoring
        from polykv_search.data import DataError, describe_split, load_corpus, split_corpus

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
        if self.loaded_model is not None:
            model, tok = self.loaded_model
            model_name = getattr(model.config, "name_or_path", "") or "loaded"
        else:
            from polykv_search.models import DEFAULT_MODEL, ModelError, load_model

            table = problem.table
            model_name = s.model or (table.provenance.get("model") if table is not None else None) or DEFAULT_MODEL
            try:
                model, tok = load_model(model_name, device=s.device, dtype=s.dtype)
            except (ModelError, ValueError) as err:
                raise SolverError(f"model: {_first_line(err)}") from None
        L = int(model.config.num_hidden_layers)
        if L != problem.num_layers:
            raise SolverError(f"model: {model_name!r} has {L} layers but the problem has {problem.num_layers}")
        from polykv_search.evaluation import samples_fingerprint
        from polykv_search.models import model_fingerprint

        try:
            task_samples = scoring.make_task_samples(tok, tasks, texts, n_samples=s.samples, context_len=s.context_len, seed=s.seed)
        except ValueError as err:
            raise SolverError(f"calibration samples: {_first_line(err)}") from None
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

    def _study_config(self, problem: Problem, calib: dict[str, Any]) -> dict[str, Any]:
        """Everything that decides a trial's value or meaning; a resumed study must match it."""
        s = self.settings
        return _jsonable(
            {
                "problem": problem.describe(),
                "signals_digest": problem.table.digest() if problem.table is not None else None,
                "space": s.space,
                "objectives": s.objectives,
                "min_budget_share": s.min_budget_share if s.two_objectives else None,
                "tasks": s.tasks,
                "corpus": s.corpus,
                "calibration": calib,
            }
        )

    @staticmethod
    def _check_config(study, config: dict[str, Any], name: str, storage: str) -> None:
        stored = study.user_attrs.get("polykv_config")
        if stored is None:
            if study.trials:
                raise SolverError(f"study {name!r} in {storage} was not made by polykv-search; use another --study-name")
            study.set_user_attr("polykv_config", config)
            return
        if stored != config:
            keys = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
            raise SolverError(
                f"study {name!r} in {storage} was made for a different problem or settings ({', '.join(keys)} differ); "
                "use another --study-name or --storage"
            )

    def _anchor_params(self, problem: Problem, uniform_best: str) -> list[tuple[str, dict[str, Any]]]:
        s = self.settings
        if s.space == "rule":
            proportional = {"family": "rule", **PROPORTIONAL_POINT}
        else:
            from solvers.proportional import ProportionalSolver

            plan = ProportionalSolver()._solve(problem)
            proportional = {"family": "per-layer"}
            for phase in problem.phases:
                for layer, (p, _) in enumerate(plan.choices[phase]):
                    proportional[_pattern_param(phase, layer)] = p
            proportional.update({k: v for k, v in PROPORTIONAL_POINT.items() if k != "alpha"})
        anchors = [
            ("proportional", proportional),
            ("ilp", {"family": "ilp", "ilp_objective": "dppl"}),
            ("uniform-best", {"family": "uniform", "uniform_pattern": uniform_best}),
        ]
        if s.two_objectives and _lowest_budget(problem, s) < problem.global_budget:
            anchors = [(n, {**p, "budget": float(problem.global_budget)}) for n, p in anchors]
        return anchors

    def _enqueue_anchors(self, study, problem: Problem, uniform_best: str) -> list[str]:
        from optuna.trial import TrialState

        names = []
        for name, params in self._anchor_params(problem, uniform_best):
            same = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("anchor") == name]
            if same and all(t.state == TrialState.FAIL for t in same):
                study.enqueue_trial(params, user_attrs={"anchor": name})  # retry an anchor whose run crashed
            else:
                study.enqueue_trial(params, user_attrs={"anchor": name}, skip_if_exists=True)
            names.append(name)
        return names

    def _objective(self, problem: Problem, signals: _Signals, evaluate):
        from strategies.strategy import LayerChoice, Strategy

        s = self.settings
        two = s.two_objectives
        L = problem.num_layers
        cache: dict[str, tuple[tuple[float, ...], dict[str, Any]]] = {}
        lock = threading.Lock()
        lo_budget = _lowest_budget(problem, s)
        families = FAMILIES_RULE if s.space == "rule" else FAMILIES_LAYERS
        optuna = _import_optuna()

        def objective(trial):
            budget = problem.global_budget
            if two:
                budget = trial.suggest_float("budget", lo_budget, problem.global_budget) if lo_budget < problem.global_budget else budget
            sub = problem if budget == problem.global_budget else dataclasses.replace(problem, global_budget=budget)
            family = trial.suggest_categorical("family", families)
            try:
                chosen = self._build(trial, family, sub, signals)
            except SolverError as err:  # e.g. the ilp grid does not fit under a small budget
                trial.set_user_attr("infeasible", str(err))
                raise optuna.TrialPruned(str(err)) from None
            per_phase = {
                phase: chosen[phase] if phase in sub.phases else [(sub.default_pattern, sub.uniform_budget)] * L
                for phase in PHASES
            }
            strategy = Strategy(
                [LayerChoice(p, b) for p, b in per_phase["prefill"]],
                [LayerChoice(p, b) for p, b in per_phase["decoding"]],
                sub.global_budget,
                sub.b_min,
                {"solver": "optuna", "trial": trial.number},
            )
            key = _digest({"choices": per_phase})[:16]
            trial.set_user_attr("key", key)
            trial.set_user_attr("budget", sub.global_budget)
            trial.set_user_attr("choices", {p: [list(c) for c in per_phase[p]] for p in PHASES})
            with lock:
                hit = cache.get(key)
            if hit is None:
                hit = _stored_values(trial.study, key)
            if hit is not None:
                values, extra = hit
                trial.set_user_attr("cached", True)
            else:
                values, extra = _values_of(evaluate(strategy), two, strategy)
                with lock:
                    cache[key] = (values, extra)
            for k, v in extra.items():
                trial.set_user_attr(k, _jsonable(v))
            return values if two else values[0]

        return objective

    def _build(self, trial, family: str, problem: Problem, signals: _Signals) -> dict[str, list[tuple[str, int]]]:
        """The (pattern, budget) choices of every optimized phase for this trial's parameters."""
        if family == "uniform":
            p = trial.suggest_categorical("uniform_pattern", list(problem.patterns))
            return {phase: [(p, problem.uniform_budget)] * problem.num_layers for phase in problem.phases}
        if family == "ilp":
            from solvers.ilp import ILPSolver

            objective = trial.suggest_categorical("ilp_objective", list(ILP_OBJECTIVES))
            plan = ILPSolver(objective=objective)._solve(problem)
            return {phase: [(p, int(b)) for p, b in plan.choices[phase]] for phase in problem.phases}
        ref = problem.reference_budget()
        if family == "rule":
            alpha = trial.suggest_float("alpha", 0.0, 1.0)
        else:
            layer_patterns = {
                phase: [trial.suggest_categorical(_pattern_param(phase, l), list(problem.patterns)) for l in range(problem.num_layers)]
                for phase in problem.phases
            }
        beta = trial.suggest_float("beta", 0.0, 1.0)
        gamma = trial.suggest_float("gamma", 0.0, GAMMA_MAX)
        floor_share = trial.suggest_float("floor_share", 0.0, FLOOR_SHARE_MAX)
        out = {}
        for phase in problem.phases:
            sig = signals.get(phase, ref)
            patterns = rule_patterns(sig, signals.names, alpha) if family == "rule" else layer_patterns[phase]
            budgets = rule_budgets(sig, problem, beta, gamma, floor_share)
            out[phase] = list(zip(patterns, budgets))
        return out


# ============================================================================ results
def front_strategies(result: SolveResult) -> list[tuple[str, Any]]:
    """One ``(suffix, Strategy)`` per Pareto front point of an ``objectives="quality,memory"``
    result, in increasing memory (``"-pareto00"``, ``"-pareto01"``, ...); ``[("", strategy)]`` for a
    single-objective result. Each strategy's ``global_budget`` is the point's budget (≤ B) and its
    provenance records the point (trial, quality, memory) and ``budget_cap`` = B."""
    front = (result.info or {}).get("front") or []
    if not front:
        return [("", result.strategy)]
    cap = result.strategy.provenance.get("budget_cap", result.strategy.provenance.get("global_budget"))
    if cap is None:
        cap = max(p["budget"] for p in front)
    width = max(2, len(str(len(front) - 1)))
    return [(f"-pareto{i:0{width}d}", _point_strategy(result.strategy, point, cap, index=i)) for i, point in enumerate(front)]


def _point_strategy(template, point: dict[str, Any], cap: float, index: int | None = None):
    from strategies.strategy import LayerChoice, Strategy

    provenance = copy.deepcopy(template.provenance)
    provenance["global_budget"] = point["budget"]
    provenance["budget_cap"] = cap
    provenance["pareto_point"] = {k: v for k, v in point.items() if k != "choices"} | ({"index": index} if index is not None else {})
    ch = point["choices"]
    return Strategy(
        [LayerChoice(p, int(b)) for p, b in ch["prefill"]],
        [LayerChoice(p, int(b)) for p, b in ch["decoding"]],
        float(point["budget"]),
        template.b_min,
        provenance,
    )


def _front(trials: list) -> list:
    """Non-dominated trials (maximize values[0], minimize values[1]), one per distinct strategy,
    sorted by memory then quality."""
    pts = sorted(trials, key=lambda t: (t.values[1], -t.values[0], t.number))
    front, seen, best_q = [], set(), -math.inf
    for t in pts:
        q = t.values[0]
        if q > best_q:
            key = t.user_attrs.get("key")
            if key not in seen:
                front.append(t)
                seen.add(key)
            best_q = q
    return front


def _trial_row(t, with_choices: bool = False) -> dict[str, Any]:
    row = {
        "trial": t.number,
        "values": list(t.values),
        "quality": t.values[0],
        "memory": t.values[1] if len(t.values) > 1 else None,
        "budget": t.user_attrs.get("budget"),
        "family": t.params.get("family"),
        "params": {k: v for k, v in t.params.items() if not re.fullmatch(r"(prefill|decoding)_pattern_\d+", k)},
        "anchor": t.user_attrs.get("anchor"),
    }
    if with_choices:
        row["choices"] = t.user_attrs.get("choices")
    return row


def _progress(study) -> tuple[int, int]:
    """(strategies scored by the evaluator, trials finished) in the whole study."""
    from optuna.trial import TrialState

    scored = finished = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        finished += 1
        scored += t.state == TrialState.COMPLETE and not t.user_attrs.get("cached")
    return scored, finished


class _StopWhenScored:
    """Stops every worker of the study once ``trials`` strategies are scored (or ``cap`` trials,
    repeats included, are finished)."""

    def __init__(self, trials: int, cap: int):
        self.trials, self.cap = trials, cap

    def __call__(self, study, trial) -> None:
        scored, finished = _progress(study)
        if scored >= self.trials or finished >= self.cap:
            study.stop()


def _stored_values(study, key: str):
    """Values of a finished trial of the same strategy (another worker's or an earlier run's)."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("key") == key:
            extra = {k: v for k, v in t.user_attrs.items() if k in ("scores", "kv_ratio", "seconds", "memory_unit")}
            return tuple(t.values), extra
    return None


# ============================================================================ helpers
def _lowest_budget(problem: Problem, settings: OptunaSettings) -> float:
    """The smallest budget a quality,memory trial may choose."""
    return max(float(problem.b_min), settings.min_budget_share * problem.global_budget)


def _import_optuna():
    try:
        import optuna
    except ModuleNotFoundError:  # pragma: no cover - optuna is a dependency
        raise SolverError("solver 'optuna' needs the optuna package (pip install optuna)") from None
    return optuna


def _make_storage(optuna, spec: str | None, study_name: str) -> tuple[Any, str]:
    """(storage object or URL, description for provenance with any password hidden)."""
    from pathlib import Path

    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if spec is not None and spec.strip().lower() in ("memory", ":memory:"):
        return optuna.storages.InMemoryStorage(), "memory"
    if spec is not None and "://" in spec:
        desc = re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", spec)
        if spec.startswith("redis"):
            try:
                from optuna.storages.journal import JournalRedisBackend

                return JournalStorage(JournalRedisBackend(spec)), desc
            except Exception as err:  # noqa: BLE001
                raise SolverError(f"storage {desc}: {_first_line(err)}") from None
        for attempt in range(4):  # workers starting together race to create the schema
            try:
                return optuna.storages.RDBStorage(spec), desc
            except Exception as err:  # noqa: BLE001 - sqlalchemy/driver errors
                if attempt == 3 or "IntegrityError" not in f"{type(err).__name__} {err}":
                    raise SolverError(f"storage {desc}: {_first_line(err)}") from None
                time.sleep(0.5 * (attempt + 1))
    if spec is None:
        from polykv_search.paths import cache_dir

        path = cache_dir("optuna") / f"{study_name}.journal"
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            raise SolverError(f"storage {spec}: is a directory; give a journal file path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SolverError(f"storage {spec}: cannot create {path.parent} ({err.strerror})") from None
    try:
        return JournalStorage(JournalFileBackend(str(path))), str(path)
    except Exception as err:  # noqa: BLE001
        raise SolverError(f"storage {path}: {_first_line(err)}") from None


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(_jsonable(obj), sort_keys=True).encode()).hexdigest()




def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]


__all__ = [
    "CalibrationEvaluator",
    "OptunaSettings",
    "OptunaSolver",
    "best_uniform_pattern",
    "front_strategies",
    "rule_budgets",
    "rule_patterns",
]
