"""The search space of the ``optuna`` solver: rule signals, rule patterns and budgets, anchors, trial choices."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from solvers.base import Problem, SolverError, allocate, predict_degradation
from solvers.ilp import ILPSolver
from solvers.optuna_settings import FLOOR_SHARE_MAX, GAMMA_MAX, ILP_OBJECTIVES, PROPORTIONAL_POINT, OptunaSettings
from solvers.optuna_study import lowest_budget
from solvers.problem import layer_choice
from solvers.proportional import ProportionalSolver
from strategies.strategy import Strategy


class RuleSignals:
    """Per (phase, reference budget): pattern preference ranks and the two sensitivities.

    ``degradation`` (``dppl`` or ``kl``) is the signal of the degradation rank ``u_ppl`` and of the
    worst-case sensitivity ``worst``."""

    def __init__(self, problem: Problem, degradation: str = "dppl"):
        self.problem = problem
        self.table = problem.require_table("optuna")
        if degradation not in self.table.signals:
            raise SolverError(
                f"degradation: the signal table has no {degradation!r} signal (version 1); recollect it or use dppl"
            )
        self.degradation = degradation
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
        cos = t.signal_array("cosine")[:, f][:, self.pidx, g]  # (L, P)
        degr = t.signal_array(self.degradation)[:, f][:, self.pidx, g]
        raw_entropy = t.entropy_array()[:, f]
        entropy = _fill(raw_entropy, 1.0)
        finite = np.isfinite(degr)
        worst = np.where(finite.any(axis=1), np.where(finite, degr, -np.inf).max(axis=1), np.nan)
        worst = _fill(worst, 0.0)
        self.filled[f"{phase}@{ref}"] = int((~np.isfinite(raw_entropy)).sum() + (~finite.any(axis=1)).sum())
        return {"u_cos": _unit_rank(cos), "u_ppl": _unit_rank(-degr), "entropy": entropy, "worst": worst}


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
            out[row, fin] = (stats.rankdata(values[row, fin], method="average") - 1.0) / (n - 1.0)
    return out


def rule_patterns(sig: dict[str, np.ndarray], names: Sequence[str], alpha: float) -> list[str]:
    score = (
        sig["u_cos"]
        if alpha == 1.0
        else (sig["u_ppl"] if alpha == 0.0 else alpha * sig["u_cos"] + (1 - alpha) * sig["u_ppl"])
    )
    return [names[int(np.argmax(row))] for row in score]  # first maximum = first listed pattern


def rule_budgets(
    sig: dict[str, np.ndarray], problem: Problem, beta: float, gamma: float, floor_share: float
) -> list[int]:
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


def best_uniform_pattern(problem: Problem, degradation: str = "dppl") -> tuple[str, float | None]:
    """The allowed pattern whose uniform strategy at ``floor(B)`` has the lowest predicted
    ``degradation`` (1 − cosine if none is available; the first listed pattern if neither is)."""
    table = problem.require_table("optuna")
    b = problem.uniform_budget
    L = problem.num_layers
    for kind in (degradation, "1-cosine"):
        scored = []
        for p in problem.allowed_patterns("optuna"):
            s = Strategy([layer_choice(p, b)] * L, [layer_choice(p, b)] * L, problem.global_budget, problem.b_min)
            v = predict_degradation(table, s, problem.phases, kind)
            if v is not None:
                scored.append((v, p))
        if scored:
            v, p = min(scored, key=lambda t: t[0])  # min keeps the first listed on ties
            return p, float(v)
    return problem.allowed_patterns("optuna")[0], None


def ilp_objectives(problem: Problem) -> list[str]:
    """The ilp family's objectives this table supports (KL only in a version-2 table)."""
    signals = problem.require_table("optuna").signals
    return [o for o in ILP_OBJECTIVES if (o != "kl" or "kl" in signals)]


def pattern_param(phase: str, layer: int) -> str:
    return f"{phase}_pattern_{layer:03d}"


def resolve_degradation(s: OptunaSettings, problem: Problem) -> str:
    """``s.degradation`` with ``auto`` resolved: ``kl`` when the table carries it, else ``dppl``."""
    if s.degradation != "auto":
        return s.degradation
    return "kl" if "kl" in problem.require_table("optuna").signals else "dppl"


def anchor_params(s: OptunaSettings, problem: Problem, uniform_best: str) -> list[tuple[str, dict[str, Any]]]:
    """The enqueued first trials: proportional, ilp (on the degradation signal) and uniform-best."""
    if s.space == "rule":
        proportional: dict[str, Any] = {"family": "rule", **PROPORTIONAL_POINT}
    else:
        plan = ProportionalSolver()._solve(problem)
        proportional = {"family": "per-layer"}
        for phase in problem.phases:
            for layer, (p, _) in enumerate(plan.pairs(phase)):
                proportional[pattern_param(phase, layer)] = p
        proportional.update({k: v for k, v in PROPORTIONAL_POINT.items() if k != "alpha"})
    anchors: list[tuple[str, dict[str, Any]]] = [
        ("proportional", proportional),
        ("ilp", {"family": "ilp", "ilp_objective": resolve_degradation(s, problem)}),
        ("uniform-best", {"family": "uniform", "uniform_pattern": uniform_best}),
    ]
    if s.two_objectives and lowest_budget(problem, s) < problem.global_budget:
        anchors = [(n, {**p, "budget": float(problem.global_budget)}) for n, p in anchors]
    return anchors


def build_choices(trial, family: str, problem: Problem, signals: RuleSignals) -> dict[str, list[tuple[str, int]]]:
    """The (pattern, budget) choices of every optimized phase for this trial's parameters."""
    if family == "uniform":
        p = trial.suggest_categorical("uniform_pattern", list(problem.allowed_patterns("optuna")))
        return {phase: [(p, problem.uniform_budget)] * problem.num_layers for phase in problem.phases}
    if family == "ilp":
        objective = trial.suggest_categorical("ilp_objective", ilp_objectives(problem))
        plan = ILPSolver(objective=objective)._solve(problem)
        return {phase: [(p, int(b)) for p, b in plan.pairs(phase)] for phase in problem.phases}
    ref = problem.reference_budget()
    if family == "rule":
        alpha = trial.suggest_float("alpha", 0.0, 1.0)
    else:
        layer_patterns = {
            phase: [
                trial.suggest_categorical(pattern_param(phase, l), list(problem.allowed_patterns("optuna")))
                for l in range(problem.num_layers)
            ]
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
