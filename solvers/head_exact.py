"""``ilp`` / ``dp --granularity head``: keep-all or one streaming cell per (layer, KV head).

Input: the signal table's head cells (:mod:`solvers.heads`): for every (layer l, KV head h) and cell
budget b, the KL(FullKV ‖ cell) measured when only that head keeps the cells' pattern (sinks + recent)
at b. The context length n (a keep-all head's budget, :func:`solvers.heads.context_length`). Options
of a head: its cells with ``b_min <= b < n`` (a cell at n or more keeps everything anyway) and
keep-all. With binary ``x[l, h, o]``::

    minimize   Σ c[l, h, o] · x[l, h, o]        c = 0 for keep-all; for a cell, its KL after the noise rule
    subject to Σ_o x[l, h, o] = 1                for every (l, h)
               Σ w[o] · x[l, h, o] <= H · floor(L·B)      w = the cell's budget, n for keep-all

So the mean budget over all (layer, KV head) is at most floor(L·B)/L <= B, i.e. the strategy's own
constraint Σ_l b_l <= L·B with b_l = mean over the layer's heads, using the same integer total
floor(L·B) as the layer-level solvers. Every head's budget is at least b_min, so every layer's mean
is too. Optional: at most ``max_distinct_budgets`` distinct head budgets. The objective assumes the
per-head KL costs add up (each cell was measured with every other head keeping everything).

It is the layer-level problem with one item per (layer, KV head) and one "pattern" per item, so
``ilp`` solves it with :func:`solvers.ilp.solve_phase_ilp` (HiGHS, zero gap, the same presolve and
tie-break) and ``dp`` with :func:`solvers.dp.solve_phase_dp` (exact knapsack); they agree on the
objective and, by the tie-break, on the budget spent. Cost of a cell (``head_signal``): KL on the
answer tokens, on prose, or their sum (standard errors combined as if independent); noise rule as in
:mod:`solvers.exact` with a normal quantile: ``clip`` max(KL, 0), ``interval`` 0 when KL ± z·SE
contains 0, ``upper`` max(KL + z·SE, 0), ``auto`` = ``upper`` when the cells have standard errors.

The chosen heads are the same in both phases (decoding follows prefill's heads, also when the table has
prefill only: :mod:`solvers.heads`, "Phases the table lacks"); keep-all heads get pattern ``full`` with
budget n, the others the cells' pattern and params (``n_sink`` = the cells' sink).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.stats import norm

from solvers.base import Plan, Problem, SolverError
from solvers.exact import HEAD_SIGNALS, ExactSettings
from solvers.heads import CELLS_OPTION, context_length, grouped_plan, head_cells, head_total

#: ``(cost [items, 1, G], grid, total) -> solution`` with ``.budgets`` and ``.objective`` (ilp's or dp's
#: phase solver with the problem's settings bound).
PhaseSolver = Callable[[np.ndarray, tuple[int, ...], int], Any]


def cell_costs(problem: Problem, settings: ExactSettings, solver: str) -> tuple[np.ndarray, tuple[int, ...], dict]:
    """``(cost [L·H, 1, G] with inf for unusable cells, grid (cell budgets..., n), facts)``; keep-all is
    the last grid value and costs 0."""
    cells = head_cells(problem.table)
    if cells is None:
        raise SolverError(
            f"{solver} --granularity head: the signal table has no head cells; collect them with "
            f"`polykv-search collect {CELLS_OPTION} ...`"
        )
    if settings.objective not in ("auto", "kl"):
        raise SolverError(f"objective: head cells carry KL only, got {settings.objective!r} (use auto or kl)")
    n = context_length(problem, settings.target_context_len, solver)
    usable = [j for j, b in enumerate(cells.budgets) if problem.b_min <= b < n]
    grid = tuple(int(cells.budgets[j]) for j in usable) + (n,)
    if settings.head_signal == "sum":
        mean = cells.mean["kl_answer"] + cells.mean["kl_prose"]
        se = np.sqrt(np.nan_to_num(cells.se["kl_answer"]) ** 2 + np.nan_to_num(cells.se["kl_prose"]) ** 2)
    else:
        key = f"kl_{settings.head_signal}"
        mean, se = cells.mean[key], np.nan_to_num(cells.se[key])
    has_se = any(np.isfinite(cells.se[k]).any() for k in cells.se)
    rule = settings.noise if settings.noise != "auto" else ("upper" if has_se else "clip")
    z = float(norm.ppf(0.5 + settings.confidence / 2))
    if rule == "upper":
        value = np.maximum(mean + z * se, 0.0)
    elif rule == "interval":
        value = np.where(mean - z * se <= 0.0, 0.0, np.maximum(mean, 0.0))
    else:
        value = np.maximum(mean, 0.0)
    L, H, _ = value.shape
    cost = np.zeros((L * H, 1, len(grid)))
    cost[:, 0, :-1] = value[:, :, usable].reshape(L * H, len(usable))
    cost[~np.isfinite(cost)] = np.inf  # NaN cells are unusable
    facts = {"pattern": cells.pattern, "params": dict(cells.params), "num_kv_heads": H, "context_len": n}
    facts.update({"noise": rule, "signal": settings.head_signal, "z": z})
    return cost, grid, facts


def solve_heads(problem: Problem, settings: ExactSettings, method: str, phase_solver: PhaseSolver) -> Plan:
    """The head-level problem of the module docstring, solved by ``method``'s ``phase_solver``."""
    cost, grid, facts = cell_costs(problem, settings, method)
    H, n = facts["num_kv_heads"], facts["context_len"]
    total = head_total(problem, H)
    if cost.shape[0] * grid[0] > total:
        raise SolverError(
            f"infeasible: every (layer, KV head) at the smallest usable budget {grid[0]} needs "
            f"{cost.shape[0] * grid[0]} tokens > H*floor(L*B) = {total}"
        )
    sol = phase_solver(cost, grid, total)
    optimal = bool(getattr(sol, "optimal", True))
    extra = {k: getattr(sol, k) for k in ("variables", "subsets") if hasattr(sol, k)}
    if hasattr(sol, "message"):
        extra["highs"] = sol.message
    L = problem.num_layers
    per_head = [
        [
            ("full", n, {}) if b == n else (facts["pattern"], b, facts["params"])
            for b in sol.budgets[layer * H : (layer + 1) * H]
        ]
        for layer in range(L)  # type: ignore[arg-type]
    ]
    full = sum(b == n for b in sol.budgets)
    spent = sum(sol.budgets)
    message = (
        f"head level: {full} of {len(sol.budgets)} KV heads keep all {n} tokens, the rest {facts['pattern']} "
        f"at {sorted(set(b for b in sol.budgets if b != n))}; optimal {facts['signal']} KL "
        f"(noise={facts['noise']}) = {sol.objective:.6g}; mean budget {spent / len(sol.budgets):.4g} of B = "
        f"{problem.global_budget:g}; tie-break {settings.tie_break}"
    )
    if not optimal:
        message = "not proven optimal: " + extra.get("highs", "")
    info = {"granularity": "head", "objective": sol.objective, "optimal": optimal, "grid": list(grid), **extra}
    provenance = {
        "granularity": "head",
        "objective_cost": {
            "objective": "kl",
            "head_signal": facts["signal"],
            "noise": facts["noise"],
            "confidence": settings.confidence,
            "tie_break": settings.tie_break,
            "tie_tolerance": settings.tie_tolerance,
        },
        "head_cells": {"pattern": facts["pattern"], "budgets": list(grid[:-1])},
        "context_len": n,
        "heads_total": total,
        "rule": "per (layer, KV head): keep-all (cost 0, budget n) or a streaming cell; sum of head budgets "
        "<= H*floor(L*B); decoding follows prefill's heads",
    }
    return grouped_plan(
        problem,
        per_head,
        n,
        objective=sol.objective,
        message=message,
        success=optimal,
        info=info,
        provenance=provenance,
    )


__all__ = ["HEAD_SIGNALS", "cell_costs", "solve_heads"]
