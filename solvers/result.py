"""What solvers return: :class:`Plan` (from ``_solve``) and :class:`SolveResult` (from ``solve``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strategies.strategy import PHASES, LayerChoice, Strategy


@dataclass
class Plan:
    """What ``_solve`` returns: per optimized phase, one ``(pattern, budget)`` per layer, or (head-level
    solvers) one :class:`~strategies.LayerChoice` with head groups, with ``context_len`` and
    ``num_kv_heads`` set (a layer's budget is then the mean over its KV heads)."""

    choices: Mapping[str, Sequence[tuple[str, int] | LayerChoice]]
    objective: float | None = None
    message: str = ""
    success: bool = True
    info: dict[str, Any] = field(default_factory=dict)
    #: extra provenance entries (e.g. CAKE's "offline approximation" label)
    provenance: dict[str, Any] = field(default_factory=dict)
    #: head-level plans: the context length the strategy is built for, and KV heads per layer
    context_len: int | None = None
    num_kv_heads: int | None = None
    #: head-level plans: ``{phase not optimized: optimized phase whose choices it copies}`` (the head cells
    #: are measured in both phases, so a phase the table lacks follows the other, not the uniform default)
    follows: dict[str, str] = field(default_factory=dict)

    def pairs(self, phase: str) -> list[tuple[str, int]]:
        """One phase's ``(pattern, budget)`` per layer, of a layer-level plan."""
        out = []
        for c in self.choices[phase]:
            if isinstance(c, LayerChoice):
                raise TypeError(f"a head-level plan has no (pattern, budget) pairs ({phase})")
            out.append(c)
        return out


@dataclass(frozen=True)
class Choice:
    layer: int
    phase: str
    pattern: str  #: "head_groups" for a layer with head groups
    budget: int | float  #: the layer's budget (with head groups: the mean over its KV heads)
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
    unused_budget : dict
        Per phase, the tokens the strategy leaves unused: ``floor(L·B) − Σ_l b_l`` (also in the
        strategy's provenance, with the total).
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
    unused_budget: dict[str, int | float] = field(default_factory=dict)

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
            "info": jsonable(self.info),
            "unused_budget": dict(self.unused_budget),
            "choices": [c.to_json() for c in self.choices],
            "strategy": self.strategy.to_json(),
        }

    def summary(self) -> str:
        """A human table: one line per layer with both phases."""
        rows = [f"{self.solver}: {self.message}".rstrip(": ")]
        pred = ", ".join(f"{k}={'n/a' if v is None else f'{v:.4g}'}" for k, v in self.predicted.items())
        rows.append(f"objective={'n/a' if self.objective is None else f'{self.objective:.6g}'}  predicted: {pred}")
        if self.unused_budget:
            rows.append("unused budget: " + ", ".join(f"{p} {n}" for p, n in self.unused_budget.items()))
        rows.append(f"{'layer':>5}  {'prefill':<24}{'decoding':<24}")
        for layer in range(self.strategy.num_layers):
            cells = []
            for phase in PHASES:
                label = self.strategy.phase(phase)[layer].label()
                cells.append(label if len(label) < 24 else label + "  ")  # head groups: wider than the column
            rows.append(f"{layer:>5}  {cells[0]:<24}{cells[1]:<24}")
        return "\n".join(rows)


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars and arrays turned into plain JSON types."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x
