"""The solver protocol: a :class:`Problem` in, a :class:`SolveResult` (with a validated
:class:`~strategies.Strategy`) out.

Every solver is one file in ``solvers/`` defining a :class:`Solver` subclass with

* ``name`` (registry key), ``description`` (one line for ``--list-methods``), ``needs_table``;
* ``Settings``: a frozen dataclass of its knobs (validated in ``__post_init__``; every field has a
  ``help`` and, where it applies, ``choices`` in its metadata, so a CLI can generate flags);
* ``_solve(problem) -> Plan``: the (pattern, budget) per layer for each phase being optimized.

:meth:`Solver.solve` does the shared work around ``_solve``: checks the problem, fills the phases
that are not optimized, builds and validates the strategy, writes provenance, evaluates the
predicted degradation on the table, and times the call.

Phases that are not optimized
    A problem names the phases to optimize (default: the table's phases, or both without a table).
    Every other phase gets the **uniform default**: ``problem.default_pattern`` (``snapkv``) at
    ``floor(B)`` tokens in every layer (capped at ``max_budget``). This is what a runtime without
    layer-wise decoding support does, and it keeps the two phases independent: a phase's choices
    never depend on whether the other phase was optimized. Exception: a head-level plan names, in
    ``Plan.follows``, phases that copy an optimized phase's head groups (:mod:`solvers.heads`: the head
    signals do not depend on the phase); the strategy's provenance lists them in ``phases_following``
    and the result's message says so.

Budgets and rounding
    Per optimized phase the total is ``T = floor(L·B)``; every solver returns integer budgets with
    ``b_min <= b_l <= max_budget`` and ``Σ_l b_l <= T``. The allocators (proportional, pyramid,
    squeeze, cake) reach ``Σ = T`` exactly unless every layer is capped at ``max_budget``
    (:func:`allocate`: real-valued targets, box constraints by a water level, largest-remainder
    rounding with ties to the lower layer index).

Unused budget
    Every result reports, per phase, the tokens its strategy leaves unused (``T − Σ_l b_l``), in
    :attr:`SolveResult.unused_budget` and in the strategy's provenance (``unused_budget``,
    ``budget_total``), so that under-spending is never silent.

Modules: :mod:`solvers.settings` (settings, :class:`SolverError`), :mod:`solvers.problem`,
:mod:`solvers.result`, :mod:`solvers.allocation`; costs and predicted degradation come from the
signal table (:mod:`signals.predict`).
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from signals.predict import NOISE_RULES, OBJECTIVES
from signals.predict import cost_tensor as _table_costs
from signals.predict import predict_degradation as _table_prediction
from signals.table import SignalTable, SignalTableError
from solvers.allocation import allocate, round_to_total
from solvers.problem import UNOPTIMIZED_RULE, Problem, layer_budgets, layer_choice
from solvers.result import Choice, Plan, SolveResult, jsonable
from solvers.settings import SettingInfo, Settings, SolverError, setting
from solvers.settings import Settings as SolverSettings
from strategies.strategy import PHASES, LayerChoice, Strategy, StrategyError

#: What the phases a head-level plan does not optimize get (``Plan.follows``; :mod:`solvers.heads`).
FOLLOW_RULE = "head-level: the phases not optimized copy the optimized phase's head groups (phases_following)"

#: Kept for old imports; use :func:`solvers.result.jsonable`.
_jsonable = jsonable


class Solver(ABC):
    """Base class of every solver (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs_table: ClassVar[bool] = False
    Settings: ClassVar[type[SolverSettings]] = SolverSettings
    #: An instance of ``Settings`` (a subclass narrows the type to its own settings class).
    settings: SolverSettings

    def __init__(self, settings: SolverSettings | None = None, **kwargs: Any) -> None:
        if settings is not None:
            if kwargs:
                raise SolverError("give either a settings object or keyword settings, not both")
            if not isinstance(settings, self.Settings):
                raise SolverError(f"settings: expected {self.Settings.__name__}, got {type(settings).__name__}")
            self.settings = settings
        else:
            names = {f.name for f in dataclasses.fields(self.Settings)}
            unknown = sorted(set(kwargs) - names)
            if unknown:
                raise SolverError(f"{self.name}: unknown setting(s) {unknown}; known: {sorted(names)}")
            self.settings = self.Settings(**kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings!r})"

    @abstractmethod
    def _solve(self, problem: Problem) -> Plan:
        """Choose (pattern, budget) per layer for every phase in ``problem.phases``."""

    def solve(self, problem: Problem) -> SolveResult:
        if not isinstance(problem, Problem):
            raise SolverError(f"problem: expected a Problem, got {type(problem).__name__}")
        start = time.perf_counter()
        if self.needs_table:
            problem.require_table(self.name)
        plan = self._solve(problem.for_solver())
        solve_s = time.perf_counter() - start
        L = problem.num_layers
        assert L is not None and problem.phases is not None
        per_phase: dict[str, list[LayerChoice]] = {}
        for phase in PHASES:
            if phase in problem.phases:
                chosen = plan.choices.get(phase)
                if chosen is None or len(chosen) != L:
                    raise SolverError(f"{self.name}: internal error, no choice for every layer in {phase}")
                per_phase[phase] = _phase_choices(self.name, problem, plan, chosen)
            elif phase in plan.follows:
                per_phase[phase] = list(per_phase[plan.follows[phase]])
            else:
                per_phase[phase] = [layer_choice(problem.default_pattern, problem.uniform_budget)] * L
        table = problem.table
        provenance: dict[str, Any] = {
            "solver": self.name,
            "settings": self.settings.to_json(),
            "global_budget": problem.global_budget,
            "b_min": problem.b_min,
            "phases_optimized": list(problem.phases),
            "unoptimized_phases": FOLLOW_RULE if plan.follows else UNOPTIMIZED_RULE,
            **({"phases_following": dict(plan.follows)} if plan.follows else {}),
            "default_pattern": problem.default_pattern,
            "budgets": list(problem.budgets) if problem.budgets is not None else None,
            "patterns": list(problem.patterns) if problem.patterns is not None else None,
            "max_budget": problem.max_budget,
            "seed": problem.seed,
            "ablation": {"uniform_budgets": problem.uniform_budgets, "fixed_pattern": problem.fixed_pattern},
            "signals_digest": table.digest() if table is not None else None,
        }
        if table is not None:
            for key in ("model", "config_hash"):
                if key in table.provenance:
                    provenance[key] = table.provenance[key]
        provenance["budget_total"] = problem.total
        provenance["unused_budget"] = {}  # filled in below, from the strategy's own layer budgets
        provenance.update(plan.provenance)
        try:
            strategy = Strategy(
                per_phase["prefill"],
                per_phase["decoding"],
                problem.global_budget,
                problem.b_min,
                provenance,
                context_len=plan.context_len,
                num_kv_heads=plan.num_kv_heads,
            )
        except StrategyError as err:  # a bug in a solver, not bad input
            raise SolverError(f"{self.name}: produced an invalid strategy ({err})") from None
        unused = {phase: unused_tokens(problem.total, strategy, phase) for phase in PHASES}
        if any(u < -1e-9 for u in unused.values()):
            raise SolverError(f"{self.name}: internal error, budgets break the constraints ({unused})")
        strategy.provenance["unused_budget"] = dict(unused)
        predicted = predictions(table, strategy, problem.phases)
        # every layer of a solved strategy has a budget (it has a global budget; Strategy checks it)
        choices = [
            Choice(layer, phase, c.pattern, c.budget, phase in problem.phases)  # type: ignore[arg-type]
            for phase in PHASES
            for layer, c in enumerate(strategy.phase(phase))
        ]
        message = plan.message
        for phase, source in plan.follows.items():
            why = "not in the signal table" if table is not None and phase not in table.phases else "not optimized"
            message += f"; {phase} follows {source}'s head groups ({phase} {why})"
        return SolveResult(
            solver=self.name,
            strategy=strategy,
            objective=plan.objective,
            predicted=predicted,
            choices=choices,
            settings=self.settings.to_json(),
            timing={"solve_s": solve_s, "total_s": time.perf_counter() - start},
            message=message.lstrip("; "),
            success=plan.success,
            info=plan.info,
            unused_budget=unused,
        )


# ============================================================================= helpers
def _phase_choices(name: str, problem: Problem, plan: Plan, chosen: Sequence) -> list[LayerChoice]:
    """One phase of a plan as layer choices, after the ablations and the constraint checks (a layer
    with head groups counts the mean over its KV heads, checked exactly by the strategy itself)."""
    if any(isinstance(c, LayerChoice) for c in chosen):
        if problem.fixed_pattern is not None or problem.uniform_budgets:
            raise SolverError(f"{name}: the ablations --fixed-pattern and --uniform-budgets apply to layer-level plans")
        return [c if isinstance(c, LayerChoice) else layer_choice(c[0], int(c[1])) for c in chosen]
    chosen = _apply_ablation(problem, chosen)
    total = sum(b for _, b in chosen)
    if total > problem.total or any(b < problem.b_min for _, b in chosen):
        raise SolverError(f"{name}: internal error, budgets break the constraints")
    return [layer_choice(p, int(b)) for p, b in chosen]


def unused_tokens(total: int, strategy: Strategy, phase: str) -> int | float:
    """``total − Σ_l b_l`` counted exactly (a head-level layer: the capped mean of its heads, a fraction; summing
    the float means could give ``-0.0`` or ``-2.8e-14`` for nothing unused): an int when whole, else a float."""
    left = Fraction(total) - sum(layer_budgets(strategy, phase), Fraction(0))
    return left.numerator if left.denominator == 1 else round(float(left), 9)


def _apply_ablation(problem: Problem, chosen: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Enforce the ablation switches on one phase's choices (solvers that ignore the allowed
    patterns, e.g. pyramid, still end with the fixed pattern)."""
    out = list(chosen)
    if problem.fixed_pattern is not None:
        out = [(problem.fixed_pattern, b) for _, b in out]
    if problem.uniform_budgets:
        out = [(p, problem.uniform_budget) for p, _ in out]
    return out


def cost_tensor(
    table: SignalTable,
    phase: str,
    objective: str,
    pattern_idx: Sequence[int],
    budget_idx: Sequence[int],
    noise: str = "none",
    level: float = 0.95,
) -> np.ndarray:
    """:func:`signals.predict.cost_tensor`, with table problems as :class:`SolverError`."""
    try:
        return _table_costs(table, phase, objective, pattern_idx, budget_idx, noise, level)
    except SignalTableError as err:
        raise SolverError(str(err)) from None


def predict_degradation(
    table: SignalTable, strategy: Strategy, phases: Sequence[str], objective: str = "dppl"
) -> float | None:
    """The table's predicted degradation of ``strategy`` (:func:`signals.predict.predict_degradation`)."""
    return _table_prediction(table, strategy, phases, objective)


def predictions(table: SignalTable | None, strategy: Strategy, phases: Sequence[str]) -> dict[str, float | None]:
    """``{objective: predicted degradation}`` for every objective (None without a table or value)."""
    return {
        kind: (_table_prediction(table, strategy, phases, kind) if table is not None else None) for kind in OBJECTIVES
    }


__all__ = [
    "NOISE_RULES",
    "OBJECTIVES",
    "UNOPTIMIZED_RULE",
    "Choice",
    "Plan",
    "Problem",
    "SettingInfo",
    "Settings",
    "SolveResult",
    "Solver",
    "SolverError",
    "allocate",
    "cost_tensor",
    "jsonable",
    "predict_degradation",
    "predictions",
    "round_to_total",
    "setting",
    "unused_tokens",
]
