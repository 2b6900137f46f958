"""Solvers: signal table + (B, b_min, phases, grid) -> :class:`~strategies.Strategy`.

One solver per file behind :class:`~solvers.base.Solver`; look them up by name::

    >>> from solvers import get_solver, list_methods, Problem
    >>> [m.name for m in list_methods()][:3]
    ['proportional', 'ilp', 'dp']
    >>> result = get_solver("uniform", pattern="tova").solve(Problem(num_layers=4, global_budget=64))
    >>> result.strategy.budgets("prefill")
    [64, 64, 64, 64]

A CLI builds flags from ``get_solver_class(name).Settings.fields_info()`` (``--name-with-dashes``)
and settings from strings with ``Settings.from_strings``.

The registry is lazy (a solver module is imported on first use), so a solver that needs heavy
dependencies costs nothing until it is asked for. ``optuna`` is reserved for
``solvers/optuna_search.py`` (class ``OptunaSolver``), which needs the runtime; until that file
exists it is listed as unavailable. Third-party solvers can be added with :func:`register_solver`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

from solvers.base import (
    OBJECTIVES,
    UNOPTIMIZED_RULE,
    Choice,
    Plan,
    Problem,
    SettingInfo,
    Settings,
    SolveResult,
    Solver,
    SolverError,
    allocate,
    predict_degradation,
)

#: name -> (module, class, one-line description). Descriptions live here so listing imports nothing.
_BUILTIN: dict[str, tuple[str, str, str]] = {
    "proportional": (
        "solvers.proportional",
        "ProportionalSolver",
        "PolyKV paper rule: best pattern per layer, budgets b_min + (LB - L b_min) * s_l / sum(s)",
    ),
    "ilp": ("solvers.ilp", "ILPSolver", "exact MILP (scipy/HiGHS): one (pattern, budget) grid cell per layer minimizing predicted degradation"),
    "dp": ("solvers.dp", "DPSolver", "exact dynamic program for the ilp problem (knapsack over layers); agrees with ilp"),
    "optuna": ("solvers.optuna_search", "OptunaSolver", "Optuna search over allocation-rule parameters, trials scored by the runtime"),
    "uniform": ("solvers.uniform", "UniformSolver", "uniform-X baseline: one pattern with budget floor(B) in every layer (no table needed)"),
    "pyramid": ("solvers.pyramid", "PyramidSolver", "PyramidKV baseline: budgets fall linearly from bottom to top layer (beta=20), mean B"),
    "squeeze": ("solvers.squeeze", "SqueezeSolver", "SqueezeAttention baseline: 3-means on layer cosine, the most redundant group gets p*B"),
    "cake": ("solvers.cake", "CakeSolver", "CAKE baseline (offline approximation): budget proportional to entropy^(1/t1) * variance^(1/t2)"),
}
_REGISTERED: dict[str, type[Solver]] = {}


@dataclass(frozen=True)
class MethodInfo:
    name: str
    description: str
    needs_table: bool | None  # None when the solver is not importable
    available: bool
    reason: str = ""


def register_solver(cls: type[Solver]) -> type[Solver]:
    """Add (or replace) a solver class under ``cls.name``; usable as a decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Solver)) or not cls.name:
        raise SolverError("register_solver: expects a Solver subclass with a name")
    _REGISTERED[cls.name] = cls
    return cls


def _names() -> list[str]:
    return list(_BUILTIN) + [n for n in _REGISTERED if n not in _BUILTIN]


def get_solver_class(name: str) -> type[Solver]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _BUILTIN:
        raise SolverError(f"unknown solver {name!r}; known: {', '.join(_names())}")
    module, cls_name, _ = _BUILTIN[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name == module:
            raise SolverError(f"solver {name!r} is not available yet ({module} does not exist)") from None
        raise SolverError(f"solver {name!r} needs the missing package {err.name!r}") from None
    cls = getattr(mod, cls_name)
    _REGISTERED[name] = cls
    return cls


def get_solver(name: str, **settings: Any) -> Solver:
    """A solver instance by name, with its settings as keyword arguments."""
    return get_solver_class(name)(**settings)


def list_methods() -> list[MethodInfo]:
    """Every solver name with its one-line description (and whether it can be loaded here)."""
    out = []
    for name in _names():
        try:
            cls = get_solver_class(name)
        except SolverError as err:
            desc = _BUILTIN[name][2] if name in _BUILTIN else ""
            out.append(MethodInfo(name, desc, None, False, str(err)))
            continue
        out.append(MethodInfo(name, cls.description or (_BUILTIN.get(name, ("", "", ""))[2]), cls.needs_table, True))
    return out


class _SolverRegistry(Mapping):
    """``SOLVERS[name]`` -> solver class (imported on first access); iterates over every name."""

    def __getitem__(self, name: str) -> type[Solver]:
        try:
            return get_solver_class(name)
        except SolverError as err:
            raise KeyError(str(err)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(_names())

    def __len__(self) -> int:
        return len(_names())

    def __contains__(self, name: object) -> bool:
        return name in _BUILTIN or name in _REGISTERED

    def __repr__(self) -> str:
        return f"SOLVERS({', '.join(_names())})"


SOLVERS: Mapping[str, type[Solver]] = _SolverRegistry()


def solve(name: str, problem: Problem, **settings: Any) -> SolveResult:
    """Shorthand: ``get_solver(name, **settings).solve(problem)``."""
    return get_solver(name, **settings).solve(problem)


__all__ = [
    "OBJECTIVES",
    "SOLVERS",
    "UNOPTIMIZED_RULE",
    "Choice",
    "MethodInfo",
    "Plan",
    "Problem",
    "SettingInfo",
    "Settings",
    "SolveResult",
    "Solver",
    "SolverError",
    "allocate",
    "get_solver",
    "get_solver_class",
    "list_methods",
    "predict_degradation",
    "register_solver",
    "solve",
]
