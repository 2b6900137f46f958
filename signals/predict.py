"""Predicted degradation from a signal table: per-cell costs and a strategy's total.

A cost is 0 for FullKV and grows with the damage a cell does:

* ``dppl``: ΔPPL = PPL(cell) − PPL(FullKV);
* ``1-cosine``: 1 − cosine similarity of the layer's output;
* ``kl``: mean per-token KL(FullKV ‖ cell), non-negative by construction.

Noise rules (``noise``) decide how a measured value becomes a cost a solver may minimize, so that no
cell is rewarded for looking better than FullKV by chance:

* ``"none"``: the value as measured (what :func:`predict_degradation` reports);
* ``"clip"``: ``max(value, 0)``; nothing costs less than FullKV;
* ``"interval"``: ``max(value, 0)``, and 0 for a cell whose ``level`` interval contains FullKV's
  value (:meth:`~signals.table.SignalTable.indistinguishable`): what the calibration cannot tell
  from FullKV costs what FullKV costs;
* ``"upper"``: ``max(value + t·SE, 0)``, the pessimistic end of the ``level`` interval (Student t
  with the table's ``se_dof``): a cell must be *confidently* cheap to be chosen, so a noisy cell
  that looks better than FullKV costs more than a well-measured one that is slightly worse.

``interval`` and ``upper`` need standard errors (a version-2 table).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from polykv_search.patterns import checked_params
from signals.table import SignalTable, SignalTableError
from signals.uncertainty import t_quantile
from strategies.choice import spec_label
from strategies.strategy import PHASES, Strategy, StrategyError

OBJECTIVES: tuple[str, ...] = ("dppl", "1-cosine", "kl")
NOISE_RULES: tuple[str, ...] = ("none", "clip", "interval", "upper")
_SIGNAL = {"dppl": "dppl", "1-cosine": "cosine", "kl": "kl"}


def cell_costs(table: SignalTable, objective: str, noise: str = "none", level: float = 0.95) -> np.ndarray:
    """Cost of every cell ``(L, F, P, G)`` under ``objective`` and ``noise``; NaN where missing."""
    if objective not in OBJECTIVES:
        raise SignalTableError(f"objective: {objective!r} is not one of {list(OBJECTIVES)}")
    if noise not in NOISE_RULES:
        raise SignalTableError(f"noise: {noise!r} is not one of {list(NOISE_RULES)}")
    signal = _SIGNAL[objective]
    if signal not in table.signals:
        raise SignalTableError(
            f"objective: the signal table has no {signal!r} signal (a version-1 table; recollect it, "
            "or use dppl or 1-cosine)"
        )
    raw = getattr(table, f"_{signal}")
    cost = 1.0 - raw if objective == "1-cosine" else raw.copy()
    if noise == "none":
        return cost
    if noise in ("interval", "upper") and not table.has_uncertainty:
        raise SignalTableError(
            f"noise: {noise!r} needs standard errors, and this signal table has none (version 1); "
            "recollect it or use noise=clip"
        )
    if noise == "upper":
        cost = cost + t_quantile(level, table.se_dof) * table.se_array(signal)
    with np.errstate(invalid="ignore"):
        cost = np.where(np.isnan(cost), np.nan, np.maximum(cost, 0.0))
    if noise == "interval":
        cost = np.where(table.indistinguishable(signal, level), 0.0, cost)
    return cost


def cost_tensor(
    table: SignalTable,
    phase: str,
    objective: str,
    pattern_idx: Sequence[int],
    budget_idx: Sequence[int],
    noise: str = "none",
    level: float = 0.95,
) -> np.ndarray:
    """Per-cell costs ``(L, len(pattern_idx), len(budget_idx))`` of one phase; ``inf`` where the
    cell is missing (the form the exact solvers take)."""
    f = table.phase_index(phase)
    sub = cell_costs(table, objective, noise, level)[:, f][:, list(pattern_idx)][:, :, list(budget_idx)]
    return np.where(np.isfinite(sub), sub, np.inf)


def predict_degradation(
    table: SignalTable, strategy: Strategy, phases: Sequence[str], objective: str = "dppl", noise: str = "none"
) -> float | None:
    """The table's predicted degradation of ``strategy``, summed over ``phases`` and layers.

    A budget on the grid reads its cell; a budget between grid values is interpolated linearly in
    log2(budget); outside the grid the nearest end is used. None if a pattern is not in the table,
    the table lacks the objective's signal, or a needed value is missing.
    """
    if _SIGNAL.get(objective) not in table.signals:
        return None
    costs = cell_costs(table, objective, noise)
    grid = np.log2(np.asarray(table.budgets, dtype=np.float64))
    total = 0.0
    for phase in phases:
        if phase not in table.phases:
            return None
        f = table.phase_index(phase)
        for layer, choice in enumerate(strategy.phase(phase)):
            column = _column(choice)
            if column is None or column not in table.patterns or choice.budget is None:
                return None
            row = costs[layer, f, table.pattern_index(column)]
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


def strategy_predictor(table: SignalTable, objective: str = "kl") -> Callable[[Any], float | None]:
    """``strategy JSON -> predicted degradation`` over both phases (None: not a strategy of this table's
    model, or a pattern or value the table lacks, e.g. FullKV's ``full``)."""

    def predict(data: Any) -> float | None:
        try:
            strategy = Strategy.from_json(data)
        except StrategyError:
            return None
        if strategy.num_layers != table.num_layers:
            return None
        return predict_degradation(table, strategy, PHASES, objective)

    return predict


def _column(choice) -> str | None:
    """The table column a choice reads: its pattern with its parameters, canonically
    (``kvzip`` with ``allocation="model"`` reads ``kvzip[allocation=model]``, not ``kvzip``)."""
    if choice.has_head_groups:
        return None
    try:
        return spec_label(choice.pattern, checked_params(choice.pattern, choice.params))
    except ValueError:
        return None


__all__ = ["NOISE_RULES", "OBJECTIVES", "cell_costs", "cost_tensor", "predict_degradation", "strategy_predictor"]
