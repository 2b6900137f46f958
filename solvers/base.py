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
    never depend on whether the other phase was optimized.

Budgets and rounding
    Per optimized phase the total is ``T = floor(L·B)``; every solver returns integer budgets with
    ``b_min <= b_l <= max_budget`` and ``Σ_l b_l <= T``. The allocators (proportional, pyramid,
    squeeze, cake) reach ``Σ = T`` exactly unless every layer is capped at ``max_budget``
    (:func:`allocate`: real-valued targets, box constraints by a water level, largest-remainder
    rounding with ties to the lower layer index).
"""

from __future__ import annotations

import dataclasses
import math
import time
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from signals.table import SignalTable
from strategies.strategy import PHASES, LayerChoice, Strategy, StrategyError

#: What the phases that are not optimized get (recorded in every strategy's provenance).
UNOPTIMIZED_RULE = "uniform default: default_pattern at floor(B) in every layer (capped at max_budget)"
OBJECTIVES: tuple[str, ...] = ("dppl", "1-cosine")


class SolverError(ValueError):
    """Bad or infeasible solver input; the message is one line and names the problem."""


# ============================================================================ settings
def setting(default: Any, help: str, choices: Sequence[Any] | None = None) -> Any:
    """A settings field with CLI metadata: ``help`` text and optional ``choices``."""
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SettingInfo:
    """One setting as a CLI sees it: ``--{name.replace('_', '-')}``."""

    name: str
    type: str  # "str", "int", "float", "bool", with "|None" when it may be omitted
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Settings:
    """Base of every solver's settings. Subclasses add fields with :func:`setting` and extra checks
    in :meth:`check`. Types and choices are checked here; ints are accepted for float fields."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind, optional = _kind(hints[f.name])
            if value is None:
                if not optional:
                    raise SolverError(f"{f.name}: must be given (a {kind})")
                continue
            if kind == "float" and _is_int(value):
                value = float(value)
                object.__setattr__(self, f.name, value)
            if not _has_kind(value, kind):
                raise SolverError(f"{f.name}: must be a {kind}, got {value!r}")
            if kind == "float" and not math.isfinite(value):
                raise SolverError(f"{f.name}: must be finite, got {value!r}")
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise SolverError(f"{f.name}: {value!r} is not one of {list(choices)}")
        self.check()

    def check(self) -> None:
        """Extra validation (ranges, cross-field rules); raise :class:`SolverError`."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def fields_info(cls) -> list[SettingInfo]:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            kind, optional = _kind(hints[f.name])
            out.append(
                SettingInfo(f.name, kind + ("|None" if optional else ""), f.default, f.metadata.get("help", ""), f.metadata.get("choices"))
            )
        return out

    @classmethod
    def from_strings(cls, values: Mapping[str, str | None]) -> "Settings":
        """Build from CLI strings (``{"beta": "20", "window": "none"}``); unknown names are errors."""
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in values.items():
            name = key.lstrip("-").replace("-", "_")
            if name not in names:
                raise SolverError(f"{key}: unknown setting; known: {sorted(names)}")
            kind, optional = _kind(hints[name])
            kwargs[name] = _parse(name, raw, kind, optional)
        return cls(**kwargs)


def _kind(tp: Any) -> tuple[str, bool]:
    args = typing.get_args(tp)
    optional = type(None) in args
    base = [a for a in args if a is not type(None)] if args else [tp]
    t = base[0] if len(base) == 1 else tp
    names = {str: "str", int: "int", float: "float", bool: "bool"}
    if t not in names:
        raise TypeError(f"settings fields must be str/int/float/bool (optionally | None), got {tp!r}")
    return names[t], optional


def _has_kind(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return _is_int(value)
    if kind == "float":
        return isinstance(value, float)
    return isinstance(value, str)


def _parse(name: str, raw: Any, kind: str, optional: bool) -> Any:
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if optional and text.lower() in ("", "none", "null"):
        return None
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
    except ValueError:
        raise SolverError(f"{name}: {raw!r} is not a valid {kind}") from None
    return text


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


# ============================================================================= problem
@dataclass(kw_only=True)
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
    table: SignalTable | None = None
    num_layers: int | None = None
    b_min: int = 1
    phases: Sequence[str] | None = None
    budgets: Sequence[int] | None = None
    patterns: Sequence[str] | None = None
    seed: int = 0
    max_budget: int | None = None
    default_pattern: str = "snapkv"
    uniform_budgets: bool = False
    fixed_pattern: str | None = None

    def __post_init__(self) -> None:
        from polykv_search.patterns import PATTERNS

        t = self.table
        if t is not None and not isinstance(t, SignalTable):
            raise SolverError(f"table: must be a SignalTable or None, got {type(t).__name__}")
        if self.num_layers is None:
            if t is None:
                raise SolverError("num_layers: required when no signal table is given")
            self.num_layers = t.num_layers
        if not _is_int(self.num_layers) or self.num_layers < 1:
            raise SolverError(f"num_layers: must be a positive integer, got {self.num_layers!r}")
        if t is not None and t.num_layers != self.num_layers:
            raise SolverError(f"num_layers: {self.num_layers} but the signal table has {t.num_layers} layers")
        B = self.global_budget
        if isinstance(B, bool) or not isinstance(B, (int, float, np.integer, np.floating)) or not math.isfinite(B):
            raise SolverError(f"global budget B: must be a finite number, got {B!r}")
        if B < 1:
            raise SolverError(f"global budget B: must be >= 1, got {B:g}")
        self.global_budget = float(B)
        if not _is_int(self.b_min) or self.b_min < 1:
            raise SolverError(f"b_min: must be a positive integer, got {self.b_min!r}")
        L = self.num_layers
        if L * self.b_min > self.total:
            raise SolverError(
                f"infeasible: L*b_min = {L}*{self.b_min} = {L * self.b_min} exceeds L*B = {L}*{B:g} = {L * B:g}"
            )
        if self.max_budget is not None:
            if not _is_int(self.max_budget) or self.max_budget < self.b_min:
                raise SolverError(f"max_budget: must be an integer >= b_min={self.b_min}, got {self.max_budget!r}")
        # phases
        if self.phases is None:
            self.phases = tuple(t.phases) if t is not None else PHASES
        phases = list(self.phases) if not isinstance(self.phases, str) else [self.phases]
        if not phases:
            raise SolverError("phases: at least one phase must be optimized")
        for p in phases:
            if p not in PHASES:
                raise SolverError(f"phases: {p!r} is not one of {list(PHASES)}")
        if len(set(phases)) != len(phases):
            raise SolverError(f"phases: duplicates in {phases}")
        self.phases = tuple(p for p in PHASES if p in phases)
        # grid
        if self.budgets is None:
            self.budgets = tuple(t.budgets) if t is not None else None
        else:
            grid = list(self.budgets) if not isinstance(self.budgets, (int, np.integer)) else [self.budgets]
            if not grid:
                raise SolverError("budgets: the budget grid is empty")
            for b in grid:
                if not _is_int(b) or b < 1:
                    raise SolverError(f"budgets: {b!r} is not a positive integer")
            grid = sorted(set(int(b) for b in grid))
            if t is not None:
                extra = [b for b in grid if b not in t.budgets]
                if extra:
                    raise SolverError(f"budgets: {extra} not in the signal table's grid {list(t.budgets)}")
            self.budgets = tuple(grid)
        # patterns
        if self.patterns is None:
            self.patterns = tuple(p for p in t.patterns if p != "full") if t is not None else None
            if self.patterns == ():
                raise SolverError("patterns: the signal table has no pattern other than 'full'")
        else:
            pats = [self.patterns] if isinstance(self.patterns, str) else list(self.patterns)
            if not pats:
                raise SolverError("patterns: the list of allowed patterns is empty")
            for p in pats:
                if p not in PATTERNS:
                    raise SolverError(f"patterns: unknown pattern {p!r}; known: {', '.join(PATTERNS)}")
                if p == "full":
                    raise SolverError("patterns: 'full' keeps every token and cannot be given a budget")
                if t is not None and p not in t.patterns:
                    raise SolverError(f"patterns: {p!r} is not in the signal table ({list(t.patterns)})")
            self.patterns = tuple(dict.fromkeys(pats))
        if self.fixed_pattern is not None:
            fp = self.fixed_pattern
            if fp not in PATTERNS or fp == "full":
                raise SolverError(f"fixed_pattern: {fp!r} is not a budgeted pattern; known: {', '.join(PATTERNS)}")
            if t is not None and fp not in t.patterns:
                raise SolverError(f"fixed_pattern: {fp!r} is not in the signal table ({list(t.patterns)})")
            if self.patterns is not None and fp not in self.patterns:
                raise SolverError(f"fixed_pattern: {fp!r} is not among the allowed patterns {list(self.patterns)}")
            self.patterns = (fp,)
        if not isinstance(self.uniform_budgets, bool):
            raise SolverError(f"uniform_budgets: must be true or false, got {self.uniform_budgets!r}")
        if self.default_pattern not in PATTERNS or self.default_pattern == "full":
            raise SolverError(f"default_pattern: {self.default_pattern!r} is not a budgeted pattern")
        if not _is_int(self.seed):
            raise SolverError(f"seed: must be an integer, got {self.seed!r}")

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
        return [table.pattern_index(p) for p in self.patterns]  # type: ignore[union-attr]

    def describe(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "global_budget": self.global_budget,
            "b_min": self.b_min,
            "phases": list(self.phases),  # type: ignore[arg-type]
            "budgets": list(self.budgets) if self.budgets is not None else None,
            "patterns": list(self.patterns) if self.patterns is not None else None,
            "seed": self.seed,
            "max_budget": self.max_budget,
            "default_pattern": self.default_pattern,
            "uniform_budgets": self.uniform_budgets,
            "fixed_pattern": self.fixed_pattern,
        }

    def for_solver(self) -> "Problem":
        """The problem a solver sees: with ``uniform_budgets`` and ``floor(B)`` on the grid, the grid
        narrows to that one value so selecting solvers pick the best pattern at it."""
        b = self.uniform_budget
        if self.uniform_budgets and self.budgets and b in self.budgets:
            return dataclasses.replace(self, budgets=(b,))
        return self


# ============================================================================== result
@dataclass
class Plan:
    """What ``_solve`` returns: per optimized phase, one ``(pattern, budget)`` per layer."""

    choices: dict[str, list[tuple[str, int]]]
    objective: float | None = None
    message: str = ""
    success: bool = True
    info: dict[str, Any] = field(default_factory=dict)
    #: extra provenance entries (e.g. CAKE's "offline approximation" label)
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    layer: int
    phase: str
    pattern: str
    budget: int
    optimized: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SolveResult:
    """The outcome of :meth:`Solver.solve` (scipy ``OptimizeResult`` in spirit).

    Attributes
    ----------
    strategy : Strategy
        Validated; its provenance records solver, settings, B, b_min and the signal table digest.
    objective : float or None
        The solver's own objective where it has one (ilp/dp: total predicted degradation over the
        optimized phases in the chosen objective), else None.
    predicted : dict
        ``{"dppl": float|None, "1-cosine": float|None}``: the table's predicted degradation of the
        strategy summed over the optimized (layer, phase) pairs; budgets off the grid are linearly
        interpolated in log2(budget) (clamped to the grid's ends); None without a table or when a
        needed value is missing.
    choices : list[Choice]
        One per (layer, phase), ``optimized`` telling which phases the solver decided.
    """

    solver: str
    strategy: Strategy
    objective: float | None
    predicted: dict[str, float | None]
    choices: list[Choice]
    settings: dict[str, Any]
    timing: dict[str, float]
    message: str = ""
    success: bool = True
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def fun(self) -> float | None:  # scipy's name for the objective value
        return self.objective

    def to_json(self) -> dict[str, Any]:
        return {
            "solver": self.solver,
            "success": self.success,
            "message": self.message,
            "objective": self.objective,
            "predicted": dict(self.predicted),
            "settings": dict(self.settings),
            "timing": dict(self.timing),
            "info": _jsonable(self.info),
            "choices": [c.to_json() for c in self.choices],
            "strategy": self.strategy.to_json(),
        }

    def summary(self) -> str:
        """A human table: one line per layer with both phases."""
        rows = [f"{self.solver}: {self.message}".rstrip(": ")]
        pred = ", ".join(f"{k}={'n/a' if v is None else f'{v:.4g}'}" for k, v in self.predicted.items())
        rows.append(f"objective={'n/a' if self.objective is None else f'{self.objective:.6g}'}  predicted: {pred}")
        rows.append(f"{'layer':>5}  {'prefill':<24}{'decoding':<24}")
        for layer in range(self.strategy.num_layers):
            cells = []
            for phase in PHASES:
                c = self.strategy.phase(phase)[layer]
                cells.append(f"{c.pattern}@{c.budget}")
            rows.append(f"{layer:>5}  {cells[0]:<24}{cells[1]:<24}")
        return "\n".join(rows)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


# =============================================================================== solver
class Solver(ABC):
    """Base class of every solver (see the module docstring)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    needs_table: ClassVar[bool] = False
    Settings: ClassVar[type[Settings]] = Settings

    def __init__(self, settings: Settings | None = None, **kwargs: Any) -> None:
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
        per_phase: dict[str, list[tuple[str, int]]] = {}
        for phase in PHASES:
            if phase in problem.phases:
                chosen = plan.choices.get(phase)
                if chosen is None or len(chosen) != L:
                    raise SolverError(f"{self.name}: internal error, no choice for every layer in {phase}")
                chosen = _apply_ablation(problem, chosen)
                total = sum(b for _, b in chosen)
                if total > problem.total or any(b < problem.b_min for _, b in chosen):
                    raise SolverError(f"{self.name}: internal error, {phase} budgets break the constraints")
                per_phase[phase] = [(p, int(b)) for p, b in chosen]
            else:
                per_phase[phase] = [(problem.default_pattern, problem.uniform_budget)] * L
        table = problem.table
        provenance: dict[str, Any] = {
            "solver": self.name,
            "settings": self.settings.to_json(),
            "global_budget": problem.global_budget,
            "b_min": problem.b_min,
            "phases_optimized": list(problem.phases),
            "unoptimized_phases": UNOPTIMIZED_RULE,
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
        provenance.update(plan.provenance)
        try:
            strategy = Strategy(
                [LayerChoice(p, b) for p, b in per_phase["prefill"]],
                [LayerChoice(p, b) for p, b in per_phase["decoding"]],
                problem.global_budget,
                problem.b_min,
                provenance,
            )
        except StrategyError as err:  # a bug in a solver, not bad input
            raise SolverError(f"{self.name}: produced an invalid strategy ({err})") from None
        predicted = {
            kind: (predict_degradation(table, strategy, problem.phases, kind) if table is not None else None)
            for kind in OBJECTIVES
        }
        choices = [
            Choice(layer, phase, per_phase[phase][layer][0], per_phase[phase][layer][1], phase in problem.phases)
            for phase in PHASES
            for layer in range(L)
        ]
        return SolveResult(
            solver=self.name,
            strategy=strategy,
            objective=plan.objective,
            predicted=predicted,
            choices=choices,
            settings=self.settings.to_json(),
            timing={"solve_s": solve_s, "total_s": time.perf_counter() - start},
            message=plan.message,
            success=plan.success,
            info=plan.info,
        )


# ============================================================================= helpers
def _apply_ablation(problem: Problem, chosen: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Enforce the ablation switches on one phase's choices (solvers that ignore the allowed
    patterns, e.g. pyramid, still end with the fixed pattern)."""
    out = list(chosen)
    if problem.fixed_pattern is not None:
        out = [(problem.fixed_pattern, b) for _, b in out]
    if problem.uniform_budgets:
        out = [(p, problem.uniform_budget) for p, _ in out]
    return out


def allocate(
    total: int,
    *,
    weights: Sequence[float] | np.ndarray,
    base: Sequence[float] | np.ndarray | float = 0.0,
    lo: int,
    hi: int | None = None,
) -> np.ndarray:
    """Integer budgets ``b_l`` in ``[lo, hi]`` with ``Σ b = total`` (or ``Σ hi`` when that is less).

    The real-valued allocation is ``r_l = clip(base_l + λ·w_l, lo, hi)`` with the water level λ
    chosen so that ``Σ r = total`` (so a capped layer's excess goes to the others in proportion to
    their weights, and a layer pushed below ``lo`` is held there); then largest-remainder rounding:
    floors first, the missing units to the largest fractional parts, ties to the lower layer index.

    If every layer with a positive weight is capped, what is left is spread evenly over the
    zero-weight layers, so ``Σ b = total`` whenever ``L·hi >= total``.

    ``base=lo, weights=s`` is the paper's ``b_min + (T − L·b_min)·s/Σs``; ``base=0, weights=p`` is a
    pure proportional share; ``base=targets, weights=1`` shifts fixed targets by a common offset.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    base_arr = np.broadcast_to(np.asarray(base, dtype=np.float64), (n,)).copy()
    if n == 0:
        raise SolverError("allocate: no layers")
    if np.any(~np.isfinite(w)) or np.any(w < 0) or np.any(~np.isfinite(base_arr)):
        raise SolverError("allocate: weights must be finite and non-negative")
    if n * lo > total:
        raise SolverError(f"infeasible: {n} layers * b_min {lo} = {n * lo} exceeds the total {total}")
    hi_f = math.inf if hi is None else float(hi)
    if n * hi_f <= total:
        return np.full(n, int(hi_f), dtype=np.int64)
    if not np.any(w > 0):
        w = np.ones(n)

    def values(lam: float) -> np.ndarray:
        return np.clip(base_arr + lam * w, lo, hi_f)

    pos = w > 0
    upper_value = np.minimum(hi_f, float(total))
    lam_hi = float(np.max((upper_value - base_arr[pos]) / w[pos])) + 1.0
    lam_lo = float(np.min((lo - base_arr[pos]) / w[pos])) - 1.0
    if values(lam_lo).sum() > total:
        raise SolverError(f"infeasible: the fixed layers alone exceed the total {total}")
    if values(lam_hi).sum() <= total:
        real = values(lam_hi)
    else:
        for _ in range(200):
            mid = 0.5 * (lam_lo + lam_hi)
            if values(mid).sum() <= total:
                lam_lo = mid
            else:
                lam_hi = mid
            if lam_hi - lam_lo <= 1e-12 * max(1.0, abs(lam_hi)):
                break
        real = values(_exact_level(lam_lo, base_arr, w, lo, hi_f, total))
    if real.sum() < total - 1e-9 and np.any((real < hi_f) & (w == 0)):
        # every weighted layer is capped: the rest goes evenly to the zero-weight layers
        return allocate(total, weights=(real < hi_f).astype(np.float64), base=real, lo=lo, hi=hi)
    target = min(total, int(math.floor(real.sum() + 1e-6)))
    return round_to_total(real, target, lo, None if hi is None else int(hi))


def _exact_level(lam: float, base: np.ndarray, w: np.ndarray, lo: float, hi: float, total: int) -> float:
    """Recompute the water level in closed form from the clamped set that bisection found, so that
    exact shares (e.g. 8.5) come out exact and ties break by index, not by rounding noise."""
    raw = base + lam * w
    tol = 1e-9 * max(1.0, float(np.abs(raw).max()))
    at_lo = raw <= lo + tol
    at_hi = raw >= hi - tol
    free = ~(at_lo | at_hi) & (w > 0)
    fixed = np.where(at_lo, lo, np.where(at_hi, hi, base + lam * w))
    if not free.any():
        return lam
    rest = total - fixed[~free].sum()
    exact = (rest - base[free].sum()) / w[free].sum()
    check = np.clip(base + exact * w, lo, hi)
    if abs(check.sum() - total) <= 1e-6 * max(1.0, total) and check.sum() <= total + 1e-9:
        return float(exact)
    return lam


def round_to_total(real: np.ndarray, target: int, lo: int, hi: int | None = None) -> np.ndarray:
    """Largest-remainder rounding of ``real`` (within ``[lo, hi]``) to integers summing to ``target``."""
    real = np.asarray(real, dtype=np.float64)
    hi_v = np.inf if hi is None else hi
    out = np.clip(np.floor(real + 1e-9), lo, hi_v).astype(np.int64)
    frac = real - out
    deficit = int(target - out.sum())
    frac = np.round(frac, 9)  # rounding noise must not decide a tie; ties go to the lower index
    order_up = sorted(range(real.size), key=lambda i: (-frac[i], i))
    order_down = sorted(range(real.size), key=lambda i: (frac[i], i))
    while deficit > 0:
        moved = False
        for i in order_up:
            if deficit == 0:
                break
            if out[i] + 1 <= hi_v:
                out[i] += 1
                deficit -= 1
                moved = True
        if not moved:
            break
    while deficit < 0:
        moved = False
        for i in order_down:
            if deficit == 0:
                break
            if out[i] - 1 >= lo:
                out[i] -= 1
                deficit += 1
                moved = True
        if not moved:
            raise SolverError(f"infeasible: cannot reach a total of {target} with every layer >= {lo}")
    return out


def cost_tensor(table: SignalTable, phase: str, objective: str, pattern_idx: Sequence[int], budget_idx: Sequence[int]) -> np.ndarray:
    """Per-cell predicted degradation ``(L, len(pattern_idx), len(budget_idx))``; ``inf`` where the
    cell is missing or not finite. ``objective`` is ``"dppl"`` or ``"1-cosine"``."""
    f = table.phase_index(phase)
    if objective == "dppl":
        raw = table._dppl[:, f]  # noqa: SLF001 - read-only view, no copy of the whole table
    elif objective == "1-cosine":
        raw = 1.0 - table._cosine[:, f]  # noqa: SLF001
    else:
        raise SolverError(f"objective: {objective!r} is not one of {list(OBJECTIVES)}")
    sub = raw[:, list(pattern_idx)][:, :, list(budget_idx)]
    return np.where(np.isfinite(sub), sub, np.inf)


def predict_degradation(
    table: SignalTable, strategy: Strategy, phases: Sequence[str], objective: str = "dppl"
) -> float | None:
    """The table's predicted degradation of ``strategy``, summed over ``phases`` and layers.

    A budget on the grid reads its cell; a budget between grid values is interpolated linearly in
    log2(budget); outside the grid the nearest end is used. None if a pattern is not in the table
    or a needed value is missing.
    """
    grid = np.log2(np.asarray(table.budgets, dtype=np.float64))
    total = 0.0
    for phase in phases:
        if phase not in table.phases:
            return None
        choices = strategy.phase(phase)
        if any(c.pattern not in table.patterns or c.budget is None for c in choices):
            return None
        rows = cost_tensor(table, phase, objective, range(len(table.patterns)), range(len(table.budgets)))
        for layer, choice in enumerate(choices):
            row = rows[layer, table.pattern_index(choice.pattern)]
            x = math.log2(max(choice.budget, 1))
            j = int(np.searchsorted(grid, x))
            if j < len(grid) and grid[j] == x:
                v = row[j]
            elif j == 0:
                v = row[0]
            elif j == len(grid):
                v = row[-1]
            else:
                t = (x - grid[j - 1]) / (grid[j] - grid[j - 1])
                v = (1 - t) * row[j - 1] + t * row[j]
            if not math.isfinite(v):
                return None
            total += float(v)
    return total


__all__ = [
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
    "predict_degradation",
    "round_to_total",
    "setting",
]
