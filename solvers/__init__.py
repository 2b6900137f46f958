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
dependencies costs nothing until it is asked for; one whose module or dependency is missing is
listed as unavailable, with the reason. Each solver's one-line description is its class's
``description``. Third-party solvers can be added with :func:`register_solver`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from solvers.base import (
    OBJECTIVES,
    UNOPTIMIZED_RULE,
    Choice,
    Plan,
    Problem,
    SettingInfo,
    Settings,
    Solver,
    SolverError,
    SolveResult,
    allocate,
    predict_degradation,
)

#: name -> (module, class); the order is the listing order of ``--list-methods``
_BUILTIN: dict[str, tuple[str, str]] = {
    "proportional": ("solvers.proportional", "ProportionalSolver"),
    "ilp": ("solvers.ilp", "ILPSolver"),
    "dp": ("solvers.dp", "DPSolver"),
    "optuna": ("solvers.optuna_search", "OptunaSolver"),
    "uniform": ("solvers.uniform", "UniformSolver"),
    "pyramid": ("solvers.pyramid", "PyramidSolver"),
    "squeeze": ("solvers.squeeze", "SqueezeSolver"),
    "cake": ("solvers.cake", "CakeSolver"),
    "duo": ("solvers.duo", "DuoSolver"),
    "headkv": ("solvers.headkv", "HeadKVSolver"),
    "search": ("solvers.whole_model", "WholeModelSolver"),
    "pool-prior": ("solvers.pool_prior", "PoolPriorSolver"),
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
    module, cls_name = _BUILTIN[name]
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
            out.append(MethodInfo(name, "", None, False, str(err)))
            continue
        out.append(MethodInfo(name, cls.description, cls.needs_table, True))
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
