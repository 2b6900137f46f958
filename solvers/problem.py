"""The :class:`Problem` a solver solves: table, layers, B, b_min, phases, grid, patterns, ablations."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from polykv_search.patterns import canonical_spec, pattern_spec
from signals.table import SignalTable
from solvers.settings import SolverError, is_int
from strategies.head_groups import mean_budget
from strategies.strategy import PHASES, LayerChoice, Strategy

#: What the phases that are not optimized get (recorded in every strategy's provenance).
UNOPTIMIZED_RULE = "uniform default: default_pattern at floor(B) in every layer (capped at max_budget)"


@dataclass(kw_only=True, init=False)
class Problem:
    """What to solve: table (or None), layers, B, b_min, phases, grid, allowed patterns, seed.

    Parameters
    ----------
    global_budget
        B, the average budget per layer; per optimized phase ``Σ_l b_l <= floor(L·B)``.
    table
        The signal table; required by table-driven solvers (proportional, ilp, dp, squeeze, cake).
    num_layers
        L; taken from the table when omitted (and must match it when both are given).
    b_min
        Smallest budget any layer may get (integer >= 1).
    phases
        Phases to optimize; default: the table's phases, or both phases without a table. The other
        phases get the uniform default (see :data:`UNOPTIMIZED_RULE`).
    budgets
        The budget grid the selecting solvers (ilp, dp) choose from and the reference budget is taken
        from; default: the table's grid. With a table it must be a subset of the table's grid.
    patterns
        Patterns the table-driven solvers may choose; default: the table's patterns except ``full``.
    seed
        Recorded in provenance; every built-in solver is deterministic (ties break to the lower
        layer / pattern / budget index).
    max_budget
        The most a layer can use (e.g. the context length); allocators cap at it and redistribute.
    default_pattern
        The pattern of the phases that are not optimized.
    uniform_budgets
        Ablation "patterns only": every optimized layer gets ``floor(B)`` (capped at ``max_budget``);
        the solver still chooses the patterns. Selecting solvers choose them at that budget when it is
        on the grid.
    fixed_pattern
        Ablation "budgets only": every optimized layer uses this pattern (the allowed patterns become
        just this one); the solver still chooses the budgets.
    """

    global_budget: float
    table: SignalTable | None
    num_layers: int
    b_min: int
    phases: tuple[str, ...]
    budgets: tuple[int, ...] | None
    patterns: tuple[str, ...] | None
    seed: int
    max_budget: int | None
    default_pattern: str
    uniform_budgets: bool
    fixed_pattern: str | None

    def __init__(
        self,
        *,
        global_budget: float,
        table: SignalTable | None = None,
        num_layers: int | None = None,
        b_min: int = 1,
        phases: Sequence[str] | None = None,
        budgets: Sequence[int] | int | None = None,
        patterns: Sequence[str] | None = None,
        seed: int = 0,
        max_budget: int | None = None,
        default_pattern: str = "snapkv",
        uniform_budgets: bool = False,
        fixed_pattern: str | None = None,
    ) -> None:
        t = table
        if t is not None and not isinstance(t, SignalTable):
            raise SolverError(f"table: must be a SignalTable or None, got {type(t).__name__}")
        self.table = t
        if num_layers is None:
            if t is None:
                raise SolverError("num_layers: required when no signal table is given")
            num_layers = t.num_layers
        if not is_int(num_layers) or num_layers < 1:
            raise SolverError(f"num_layers: must be a positive integer, got {num_layers!r}")
        if t is not None and t.num_layers != num_layers:
            raise SolverError(f"num_layers: {num_layers} but the signal table has {t.num_layers} layers")
        self.num_layers = L = int(num_layers)
        B = global_budget
        if isinstance(B, bool) or not isinstance(B, (int, float, np.integer, np.floating)) or not math.isfinite(B):
            raise SolverError(f"global budget B: must be a finite number, got {B!r}")
        if B < 1:
            raise SolverError(f"global budget B: must be >= 1, got {B:g}")
        self.global_budget = float(B)
        if not is_int(b_min) or b_min < 1:
            raise SolverError(f"b_min: must be a positive integer, got {b_min!r}")
        self.b_min = int(b_min)
        if L * self.b_min > self.total:
            raise SolverError(
                f"infeasible: L*b_min = {L}*{self.b_min} = {L * self.b_min} exceeds L*B = {L}*{B:g} = {L * B:g}"
            )
        if max_budget is not None:
            if not is_int(max_budget) or max_budget < self.b_min:
                raise SolverError(f"max_budget: must be an integer >= b_min={self.b_min}, got {max_budget!r}")
            max_budget = int(max_budget)
        self.max_budget = max_budget
        self.phases = _phases(phases, t)
        self.budgets = _grid(budgets, t)
        self.patterns = _patterns(patterns, t)
        if fixed_pattern is not None:
            fp = fixed_pattern = _canonical(fixed_pattern, "fixed_pattern")
            if fp == "full":
                raise SolverError(f"fixed_pattern: {fp!r} is not a budgeted pattern")
            if t is not None and fp not in t.patterns:
                raise SolverError(f"fixed_pattern: {fp!r} is not in the signal table ({list(t.patterns)})")
            if self.patterns is not None and fp not in self.patterns:
                raise SolverError(f"fixed_pattern: {fp!r} is not among the allowed patterns {list(self.patterns)}")
            self.patterns = (fp,)
        self.fixed_pattern = fixed_pattern
        if not isinstance(uniform_budgets, bool):
            raise SolverError(f"uniform_budgets: must be true or false, got {uniform_budgets!r}")
        self.uniform_budgets = uniform_budgets
        self.default_pattern = _canonical(default_pattern, "default_pattern")
        if self.default_pattern == "full":
            raise SolverError(f"default_pattern: {self.default_pattern!r} is not a budgeted pattern")
        if not is_int(seed):
            raise SolverError(f"seed: must be an integer, got {seed!r}")
        self.seed = seed

    # ----------------------------------------------------------------- derived
    @property
    def total(self) -> int:
        """T = floor(L·B): the integer budget total allowed per phase."""
        return int(math.floor(self.num_layers * self.global_budget + 1e-9))

    @property
    def uniform_budget(self) -> int:
        """floor(B), capped at max_budget: what every layer gets under a uniform strategy."""
        b = int(math.floor(self.global_budget + 1e-9))
        return min(b, self.max_budget) if self.max_budget is not None else b

    def require_table(self, solver: str) -> SignalTable:
        if self.table is None:
            raise SolverError(f"solver {solver!r} needs a signal table (collect one, then pass --signals)")
        for phase in self.phases:
            if phase not in self.table.phases:
                raise SolverError(
                    f"phases: {phase!r} is not in the signal table (it has {list(self.table.phases)}); "
                    f"optimize only {list(self.table.phases)}"
                )
        return self.table

    def selection_grid(self) -> tuple[int, ...]:
        """Grid values a selecting solver may give a layer: the grid entries in [b_min, max_budget]."""
        if not self.budgets:
            raise SolverError("budgets: no budget grid (give --budgets or a signal table)")
        grid = tuple(b for b in self.budgets if b >= self.b_min)
        if not grid:
            raise SolverError(f"budgets: no grid value is >= b_min={self.b_min} (grid {list(self.budgets)})")
        if self.max_budget is not None:
            grid = tuple(b for b in grid if b <= self.max_budget)
            if not grid:
                raise SolverError(
                    f"budgets: no grid value is within [b_min, max_budget] = [{self.b_min}, {self.max_budget}] "
                    f"(grid {list(self.budgets)})"
                )
        if self.num_layers * grid[0] > self.total:
            raise SolverError(
                f"infeasible: the smallest usable grid value {grid[0]} in every layer needs "
                f"{self.num_layers * grid[0]} > L*B = {self.total}"
            )
        return grid

    def reference_budget(self, explicit: int | None = None) -> int:
        """The grid value where preferences and sensitivities are read: ``explicit`` if given (it
        must be on the grid), else the grid value closest to B (ties go to the smaller one)."""
        grid = self.budgets
        if not grid:
            raise SolverError("budgets: no budget grid to take the reference budget from")
        if explicit is not None:
            if explicit not in grid:
                raise SolverError(f"reference_budget: {explicit} is not on the grid {list(grid)}")
            return explicit
        return min(grid, key=lambda b: (abs(b - self.global_budget), b))

    def pattern_indices(self) -> list[int]:
        table = self.require_table("this solver")
        return [table.pattern_index(p) for p in self.allowed_patterns("this solver")]

    def allowed_patterns(self, solver: str) -> tuple[str, ...]:
        """``patterns``, for a solver that chooses among them (a signal table gives them when none are named)."""
        if self.patterns is None:
            raise SolverError(f"solver {solver!r} needs the allowed patterns (give --patterns or a signal table)")
        return self.patterns

    def describe(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "global_budget": self.global_budget,
            "b_min": self.b_min,
            "phases": list(self.phases),
            "budgets": list(self.budgets) if self.budgets is not None else None,
            "patterns": list(self.patterns) if self.patterns is not None else None,
            "seed": self.seed,
            "max_budget": self.max_budget,
            "default_pattern": self.default_pattern,
            "uniform_budgets": self.uniform_budgets,
            "fixed_pattern": self.fixed_pattern,
        }

    def for_solver(self) -> Problem:
        """The problem a solver sees: with ``uniform_budgets`` and ``floor(B)`` on the grid, the grid
        narrows to that one value so selecting solvers pick the best pattern at it."""
        b = self.uniform_budget
        if self.uniform_budgets and self.budgets and b in self.budgets:
            return dataclasses.replace(self, budgets=(b,))
        return self


def _phases(phases: Sequence[str] | None, t: SignalTable | None) -> tuple[str, ...]:
    """The phases to optimize, in :data:`PHASES` order (default: the table's, or both)."""
    if phases is None:
        phases = tuple(t.phases) if t is not None else PHASES
    given = list(phases) if not isinstance(phases, str) else [phases]
    if not given:
        raise SolverError("phases: at least one phase must be optimized")
    for p in given:
        if p not in PHASES:
            raise SolverError(f"phases: {p!r} is not one of {list(PHASES)}")
    if len(set(given)) != len(given):
        raise SolverError(f"phases: duplicates in {given}")
    return tuple(p for p in PHASES if p in given)


def _grid(budgets: Sequence[int] | int | None, t: SignalTable | None) -> tuple[int, ...] | None:
    """The budget grid, sorted and deduplicated (default: the table's grid; None without a table)."""
    if budgets is None:
        return tuple(t.budgets) if t is not None else None
    grid = list(budgets) if not isinstance(budgets, (int, np.integer)) else [budgets]
    if not grid:
        raise SolverError("budgets: the budget grid is empty")
    for b in grid:
        if not is_int(b) or b < 1:
            raise SolverError(f"budgets: {b!r} is not a positive integer")
    values = sorted(set(int(b) for b in grid))
    if t is not None:
        extra = [b for b in values if b not in t.budgets]
        if extra:
            raise SolverError(f"budgets: {extra} not in the signal table's grid {list(t.budgets)}")
    return tuple(values)


def _patterns(patterns: Sequence[str] | None, t: SignalTable | None) -> tuple[str, ...] | None:
    """The allowed patterns, canonical and deduplicated (default: the table's except ``full``; None without
    a table)."""
    if patterns is None:
        if t is None:
            return None
        allowed = tuple(p for p in t.patterns if p != "full")
        if allowed == ():
            raise SolverError("patterns: the signal table has no pattern other than 'full'")
        return allowed
    pats = [patterns] if isinstance(patterns, str) else list(patterns)
    if not pats:
        raise SolverError("patterns: the list of allowed patterns is empty")
    pats = [_canonical(p, "patterns") for p in pats]
    for p in pats:
        if p == "full":
            raise SolverError("patterns: 'full' keeps every token and cannot be given a budget")
        if t is not None and p not in t.patterns:
            raise SolverError(f"patterns: {p!r} is not in the signal table ({list(t.patterns)})")
    return tuple(dict.fromkeys(pats))


def _canonical(spec: Any, field: str) -> str:
    """A pattern spec's canonical text (``kvzip[allocation=head]`` is ``kvzip``), or a one-line
    :class:`SolverError`."""
    if not isinstance(spec, str):
        raise SolverError(f"{field}: a pattern name, got {spec!r}")
    try:
        return canonical_spec(spec)
    except ValueError as err:
        raise SolverError(f"{field}: {err}") from None


def layer_choice(spec: str, budget: int | float | None) -> LayerChoice:
    """The strategy's choice for a pattern spec at ``budget``: ``kvzip[allocation=model]`` becomes pattern
    ``kvzip`` with params ``{"allocation": "model"}``."""
    name, params = pattern_spec(spec)
    return LayerChoice(name, budget, params)


def layer_budgets(strategy: Strategy, phase: str) -> list[Fraction]:
    """Each layer's budget in ``phase``, exactly: a head-level layer's is the mean of its heads' budgets capped at
    ``context_len`` (a fraction; summing float means could give ``-2.8e-14`` for nothing unused). A strategy with
    head groups has ``context_len`` and ``num_kv_heads`` (the :class:`Strategy` checks it); a layer without a budget
    (FullKV's, in a strategy without a global budget) counts nothing."""
    context_len, heads = strategy.context_len, strategy.num_kv_heads
    out = []
    for c in strategy.phase(phase):
        if c.head_groups is not None and context_len is not None and heads is not None:
            out.append(mean_budget(c.head_groups, context_len, heads))
        elif c.budget is not None:
            out.append(Fraction(c.budget))
    return out
