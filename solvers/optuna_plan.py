"""The optuna solver's result: the best finished trial of a study as a plan, with the study's provenance.

Split from :mod:`solvers.optuna_search` (which sets up and runs the study): this module only reads a
finished study.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from solvers.base import Plan, Problem, SolverError
from solvers.optuna_settings import FAMILIES_LAYERS, FAMILIES_RULE, OptunaSettings
from solvers.optuna_space import RuleSignals
from solvers.optuna_study import pareto_front, progress, trial_row


@dataclass(frozen=True)
class StudySetup:
    """What one solve decided before running its study: where it lives, how it samples, its anchors."""

    study_name: str
    storage: Any
    storage_desc: str
    sampler: Any
    sampler_desc: dict[str, Any]
    config: dict[str, Any]
    calib: dict[str, Any]
    degradation: str
    uniform_best: str
    uniform_pred: float | None


def study_plan(
    optuna, study, ran: int, problem: Problem, signals: RuleSignals, setup: StudySetup, settings: OptunaSettings
) -> Plan:
    """The best finished trial as a plan, with the study's provenance and a one-line message."""
    s = settings
    study_name, storage_desc, sampler_desc = setup.study_name, setup.storage_desc, setup.sampler_desc
    uniform_best, degradation, uniform_pred = setup.uniform_best, setup.degradation, setup.uniform_pred
    calib = setup.calib
    two = s.two_objectives
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise SolverError(f"optuna: study {study_name!r} has no finished trial")
    anchor_rows = [
        {
            "anchor": t.user_attrs["anchor"],
            "trial": t.number,
            "values": list(t.values),
            "family": t.params.get("family"),
        }
        for t in complete
        if "anchor" in t.user_attrs
    ]
    front = []
    if two:
        front = pareto_front(complete)
        best = max(front, key=lambda t: (t.values[0], -t.values[1], -t.number))
    else:
        best = max(complete, key=lambda t: (t.values[0], -t.number))  # ties -> earliest (anchors first)
    choices = {phase: [(p, b) for p, b in best.user_attrs["choices"][phase]] for phase in problem.phases}
    best_row = trial_row(best)
    front_rows = [trial_row(t, with_choices=True) for t in front]
    provenance = {
        "optuna": {
            "study_name": study_name,
            "storage": storage_desc,
            "sampler": sampler_desc,
            "objectives": {"quality": "maximize", **({"memory": "minimize"} if two else {})},
            "quality": f"mean task score (0-100) of {s.tasks}"
            if s.metric == "score"
            else f"-mean log perplexity of {s.tasks}",
            "memory_unit": best.user_attrs.get("memory_unit") if two else None,
            "space": s.space,
            "families": list(FAMILIES_RULE if s.space == "rule" else FAMILIES_LAYERS),
            "strategies_scored": progress(study)[0],
            "trials_complete": len(complete),
            "trials_total": len(study.trials),
            "trials_run_now": ran,
            "best": best_row,
            "anchors": anchor_rows,
            "uniform_best": {"pattern": uniform_best, "degradation": degradation, "predicted": uniform_pred},
            "calibration": calib,
            "front": [{k: v for k, v in r.items() if k != "choices"} for r in front_rows] if two else None,
        }
    }
    anchor_best = max((a["values"][0] for a in anchor_rows), default=None)
    message = (
        f"best calibration quality {best.values[0]:.4g} (trial {best.number}, {best.params.get('family')}; "
        f"best anchor {'n/a' if anchor_best is None else f'{anchor_best:.4g}'}); "
        f"{progress(study)[0]} strategies scored in {len(complete)} trials"
    )
    if two:
        message += f"; Pareto front of {len(front)} points"
    info = {
        "study_name": study_name,
        "storage": storage_desc,
        "best": best_row,
        "anchors": anchor_rows,
        "front": front_rows,
        "main_point": trial_row(best, with_choices=True) if two else None,
        "signals_filled": dict(signals.filled),
    }
    return Plan(choices, objective=None, message=message, info=info, provenance=provenance)
