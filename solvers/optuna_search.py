"""``optuna``: search the parameters of an allocation rule, scoring every trial with the runtime.

Every trial builds a strategy that is feasible by construction (budgets from
:func:`~solvers.base.allocate`, the ``ilp`` solver, or ``floor(B)``) and scores it by running the
runtime on **calibration** samples (the calibration split of ``corpus``, never the evaluation
split) with the scoring code of ``polykv-search score`` (:func:`polykv_search.scoring.score_entry`).

Search space (a categorical ``family`` with conditional parameters)
    ``rule`` (``space="rule"``): the paper's rule with four continuous knobs. Per (layer, phase)
    and allowed pattern, at the reference budget (grid value closest to B):

    * pattern = argmax of ``alpha·u_cos + (1 − alpha)·u_ppl``, where ``u_cos`` / ``u_ppl`` are the
      pattern's rank among the layer's patterns by cosine (higher is better) / by the degradation
      signal, ΔPPL or KL (lower is better), scaled to [0, 1] (a missing cell ranks −1; ties to the
      pattern listed first);
    * sensitivity ``s = beta·entropy/max(entropy) + (1 − beta)·w/max(w)`` with ``w`` the worst-case
      degradation signal over the allowed patterns (negative values count as 0; at ``beta`` = 1 or 0 the raw
      signal is used);
    * budgets ``allocate(T, weights=s**gamma, base=b_min + floor_share·(B − b_min), lo=b_min,
      hi=max_budget)``: every layer first gets a floor between b_min and B, the rest is shared
      in proportion to ``s**gamma`` (``gamma`` in [0, 3]), with Σ = ``floor(L·B)`` exactly.

    ``(alpha, beta, gamma, floor_share) = (1, 1, 1, 0)`` is exactly ``proportional`` (cosine
    preference, entropy sensitivity).

    ``per-layer`` (``space="per-layer"``, the ablation): a categorical pattern per (layer, phase)
    and the same budget shape (``beta``, ``gamma``, ``floor_share``).

    ``ilp``: the ``ilp`` solver with ``ilp_objective`` ∈ {dppl, 1-cosine, kl} (kl where the table
    has it), with its default noise rule and tie-break.
    ``uniform``: one pattern (``uniform_pattern``) at ``floor(B)`` in every layer.

Anchors
    The first trials are enqueued (``enqueue_trial(..., skip_if_exists=True)``, so a resumed study
    does not repeat them): ``proportional`` (the rule at (1, 1, 1, 0)), ``ilp`` (objective: the
    ``degradation`` signal) and ``uniform-best`` (the allowed pattern with the lowest predicted
    degradation of the uniform strategy at B in the table). The best trial is therefore never worse
    than the best anchor. ``degradation`` (``auto``: KL when the table has it, else ΔPPL) is also
    the signal of the rule's ``u_ppl`` rank and worst-case sensitivity ``w`` below.

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
    attributes); a study stops after ``4·trials`` trials in all even so. ``storage`` defaults to a
    journal file ``<cache>/optuna/<study_name>.journal``; a path
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

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from solvers.base import (
    Choice,
    Plan,
    Problem,
    Solver,
    SolverError,
    SolveResult,
    jsonable,
    predictions,
    unused_tokens,
)
from solvers.optuna_evaluate import CalibrationEvaluator, Evaluator, calibration_evaluator, values_of
from solvers.optuna_plan import StudySetup, study_plan
from solvers.optuna_settings import FAMILIES_LAYERS, FAMILIES_RULE, MAX_TRIALS_FACTOR, OptunaSettings
from solvers.optuna_space import (
    RuleSignals,
    anchor_params,
    best_uniform_pattern,
    build_choices,
    resolve_degradation,
    rule_budgets,
    rule_patterns,
)
from solvers.optuna_study import (
    StopWhenScored,
    check_config,
    check_storage,
    digest,
    first_line,
    front_strategies,
    import_optuna,
    lowest_budget,
    make_sampler,
    make_storage,
    point_strategy,
    progress,
    stored_values,
)
from solvers.problem import layer_choice
from strategies.strategy import PHASES, Strategy


class OptunaSolver(Solver):
    name = "optuna"
    description = "Optuna search over allocation-rule parameters, trials scored by the runtime"
    needs_table = True
    Settings = OptunaSettings
    settings: OptunaSettings

    def __init__(
        self,
        settings: OptunaSettings | None = None,
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
            strategy = point_strategy(result.strategy, main, problem.global_budget)
            result.strategy = strategy
            table = problem.table
            result.predicted = predictions(table, strategy, problem.phases)
            total = int(problem.num_layers * strategy.global_budget + 1e-9)
            result.unused_budget = {p: unused_tokens(total, strategy, p) for p in PHASES}
            strategy.provenance["budget_total"] = total
            strategy.provenance["unused_budget"] = dict(result.unused_budget)
            result.choices = [
                Choice(
                    l, phase, strategy.phase(phase)[l].pattern, strategy.phase(phase)[l].budget, phase in problem.phases
                )
                for phase in PHASES
                for l in range(problem.num_layers)
            ]
        return result

    def _solve(self, problem: Problem) -> Plan:
        optuna = import_optuna()
        s = self.settings
        check_storage(s.storage)  # a storage that cannot work is refused before the scoring model loads
        degradation = resolve_degradation(s, problem)
        signals = RuleSignals(problem, degradation)
        uniform_best, uniform_pred = best_uniform_pattern(problem, degradation)
        evaluate, calib = self._make_evaluator(problem)
        config = self._study_config(problem, calib)
        study_name = s.study_name or "polykv-" + digest(config)[:12]
        storage, storage_desc = make_storage(optuna, s.storage, study_name)
        sampler, sampler_desc = make_sampler(optuna, s)
        setup = StudySetup(
            study_name,
            storage,
            storage_desc,
            sampler,
            sampler_desc,
            config,
            calib,
            degradation,
            uniform_best,
            uniform_pred,
        )
        study, ran = self._run_study(optuna, problem, signals, evaluate, setup)
        return study_plan(optuna, study, ran, problem, signals, setup, self.settings)

    def _run_study(self, optuna, problem: Problem, signals: RuleSignals, evaluate, setup: StudySetup):
        """Open (or resume) the study, add the anchor trials and optimize until ``trials`` strategies are
        scored. Returns the study and the number of trials run now."""
        s = self.settings
        study_name, storage, storage_desc = setup.study_name, setup.storage, setup.storage_desc
        sampler, config, uniform_best = setup.sampler, setup.config, setup.uniform_best
        directions = ["maximize", "minimize"] if s.two_objectives else ["maximize"]
        previous = optuna.logging.get_verbosity()
        if not s.verbose:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            try:
                study = optuna.create_study(
                    storage=storage, sampler=sampler, study_name=study_name, directions=directions, load_if_exists=True
                )
            except Exception as err:  # noqa: BLE001 - storage errors come in many types
                raise SolverError(
                    f"storage {storage_desc}: cannot open study {study_name!r} ({first_line(err)})"
                ) from None
            self.study = study
            check_config(study, config, study_name, storage_desc)
            self._enqueue_anchors(study, problem, uniform_best)
            objective = self._objective(problem, signals, evaluate)
            scored, finished = progress(study)
            cap = MAX_TRIALS_FACTOR * s.trials
            ran = 0
            if scored < s.trials and finished < cap:
                study.optimize(
                    objective,
                    n_trials=cap - finished,
                    n_jobs=s.jobs,
                    callbacks=[StopWhenScored(s.trials, cap)],
                    catch=(),
                    gc_after_trial=False,
                )
                ran = progress(study)[1] - finished
        finally:
            optuna.logging.set_verbosity(previous)

        return study, ran

    def _make_evaluator(self, problem: Problem) -> tuple[Callable[[Any], Any], dict[str, Any]]:
        if self.evaluator is not None:
            return self.evaluator, {"evaluator": getattr(self.evaluator, "__qualname__", type(self.evaluator).__name__)}
        return calibration_evaluator(self.settings, problem, self.loaded_model)

    def _study_config(self, problem: Problem, calib: dict[str, Any]) -> dict[str, Any]:
        """Everything that decides a trial's value or meaning; a resumed study must match it."""
        s = self.settings
        return jsonable(
            {
                "problem": problem.describe(),
                "signals_digest": problem.table.digest() if problem.table is not None else None,
                "space": s.space,
                "degradation": s.degradation,
                "objectives": s.objectives,
                "min_budget_share": s.min_budget_share if s.two_objectives else None,
                "tasks": s.tasks,
                "corpus": s.corpus,
                "calibration": calib,
            }
        )

    def _enqueue_anchors(self, study, problem: Problem, uniform_best: str) -> list[str]:
        from optuna.trial import TrialState  # optuna on first use, as in solvers/optuna_study.py

        names = []
        for name, params in anchor_params(self.settings, problem, uniform_best):
            same = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("anchor") == name]
            if same and all(t.state == TrialState.FAIL for t in same):
                study.enqueue_trial(params, user_attrs={"anchor": name})  # retry an anchor whose run crashed
            else:
                study.enqueue_trial(params, user_attrs={"anchor": name}, skip_if_exists=True)
            names.append(name)
        return names

    def _objective(self, problem: Problem, signals: RuleSignals, evaluate):
        s = self.settings
        two = s.two_objectives
        L = problem.num_layers
        cache: dict[str, tuple[tuple[float, ...], dict[str, Any]]] = {}
        lock = threading.Lock()
        lo_budget = lowest_budget(problem, s)
        families = FAMILIES_RULE if s.space == "rule" else FAMILIES_LAYERS
        optuna = import_optuna()

        def objective(trial):
            budget = problem.global_budget
            if two:
                budget = (
                    trial.suggest_float("budget", lo_budget, problem.global_budget)
                    if lo_budget < problem.global_budget
                    else budget
                )
            sub = problem if budget == problem.global_budget else dataclasses.replace(problem, global_budget=budget)
            family = trial.suggest_categorical("family", families)
            try:
                chosen = build_choices(trial, family, sub, signals)
            except SolverError as err:  # e.g. the ilp grid does not fit under a small budget
                trial.set_user_attr("infeasible", str(err))
                raise optuna.TrialPruned(str(err)) from None
            per_phase = {
                phase: chosen[phase] if phase in sub.phases else [(sub.default_pattern, sub.uniform_budget)] * L
                for phase in PHASES
            }
            strategy = Strategy(
                [layer_choice(p, b) for p, b in per_phase["prefill"]],
                [layer_choice(p, b) for p, b in per_phase["decoding"]],
                sub.global_budget,
                sub.b_min,
                {"solver": "optuna", "trial": trial.number},
            )
            key = digest({"choices": per_phase})[:16]
            trial.set_user_attr("key", key)
            trial.set_user_attr("budget", sub.global_budget)
            trial.set_user_attr("choices", {p: [list(c) for c in per_phase[p]] for p in PHASES})
            with lock:
                hit = cache.get(key)
            if hit is None:
                hit = stored_values(trial.study, key)
            if hit is not None:
                values, extra = hit
                trial.set_user_attr("cached", True)
            else:
                values, extra = values_of(evaluate(strategy), two, strategy)
                with lock:
                    cache[key] = (values, extra)
            for k, v in extra.items():
                trial.set_user_attr(k, jsonable(v))
            return values if two else values[0]

        return objective


__all__ = [
    "CalibrationEvaluator",
    "OptunaSettings",
    "OptunaSolver",
    "best_uniform_pattern",
    "front_strategies",
    "rule_budgets",
    "rule_patterns",
]
