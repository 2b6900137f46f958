"""``ilp`` / ``dp --granularity head``: keep-all or one (pattern, budget) head cell per (layer, KV head).

Input: the signal table's head cells (:mod:`solvers.heads`), one kind per pattern r: the streaming cells
(``streaming_llm``, the head streams in both phases) and, when ``collect --head-patterns`` measured them, the
prefill cells of scored patterns (snapkv, h2o, ...: only the head's prompt is compressed). For every (layer l,
KV head h), pattern r and budget b of r's grid, c[l, h, r, b] = KL(FullKV ‖ cell) measured when only that
head keeps r at b (every other head keeps everything). The context length n (a keep-all head's budget,
:func:`solvers.heads.context_length`). Options of a head: keep-all, and every (r, b) with ``b_min <= b < n``
(a cell at n or more keeps everything anyway). With binary ``x[l, h, o]``::

    minimize   Σ c[l, h, o] · x[l, h, o]        c = 0 for keep-all; for a cell, its KL after the noise rule
    subject to Σ_o x[l, h, o] = 1                for every (l, h)
               Σ w[o] · x[l, h, o] <= H · floor(L·B)      w = the cell's budget b, n for keep-all

So the mean budget over all (layer, KV head) is at most floor(L·B)/L <= B, i.e. the strategy's own
constraint Σ_l b_l <= L·B with b_l = mean over the layer's heads, using the same integer total
floor(L·B) as the layer-level solvers. Every head's budget is at least b_min, so every layer's mean
is too. Optional: at most ``max_distinct_budgets`` distinct head budgets (over all patterns). The
objective assumes the per-head KL costs add up (each cell was measured with every other head keeping
everything), across heads and patterns alike. ``head_patterns`` restricts the patterns (default: every kind
of cells in the table).

It is the layer-level problem with one item per (layer, KV head), the patterns ``full`` (keep-all, usable at
n only) and the cells' patterns, on the union of their budget grids plus n (a pattern's cost is inf at a
budget it was not measured at). So ``ilp`` solves it with :func:`solvers.ilp.solve_phase_ilp` (HiGHS, zero
gap, the same presolve and tie-break) and ``dp`` with :func:`solvers.dp.solve_phase_dp` (exact knapsack);
they agree on the objective and, by the tie-break, on the budget spent (and, when no two patterns cost the
same at a budget, on every head's choice). Cost of a cell (``head_signal``): KL on the answer tokens, on
prose, or their sum (standard errors combined as if independent); noise rule as in :mod:`solvers.exact`
with a normal quantile: ``clip`` max(KL, 0), ``interval`` 0 when KL ± z·SE contains 0, ``upper`` max(KL +
z·SE, 0), ``auto`` = ``upper`` when the cells have standard errors.

Head groups: a layer's heads with the same choice share a group (e.g. ``full@1024[0]`` beside
``h2o@64[1,2]``); keep-all heads get pattern ``full`` with budget n, the others their cell's pattern and
params (``n_sink`` = the streaming cells' sink; a scored pattern's stored params, ``{}`` = its defaults).
The groups are the same in both phases: decoding follows prefill's head groups, also when the table has
prefill only (:mod:`solvers.heads`, "Phases the table lacks"). A streaming cell measured exactly that
(the head streams while decoding); a prefill cell measured the head keeping every continuation token, so
for a scored head the strategy's decoding (its pattern evicting at its budget) is not in the cost: the
prefill cells under-state what a scored head costs on long generations. A pooled pattern's cells
(``kvzip[allocation=model]``) cost a head at its own top b, while the strategy pools every head given that
pattern (a group each, :func:`solvers.heads.grouped_plan`) at the sum of their budgets: the pool's
redistribution between them is not in the objective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.stats import norm

from polykv_search.patterns.spec import parse_spec, split_specs
from solvers.base import Plan, Problem, SolverError
from solvers.exact import HEAD_SIGNALS, ExactSettings
from solvers.heads import CELLS_OPTION, HeadCells, context_length, grouped_plan, head_cell_sets, head_total
from strategies.pattern_spec import short_label

#: ``(cost [items, P, G], patterns, grid, total) -> solution`` with ``.patterns``, ``.budgets`` and
#: ``.objective`` (ilp's or dp's phase solver with the problem's settings bound).
PhaseSolver = Callable[[np.ndarray, list[str], tuple[int, ...], int], Any]
KEEP_ALL = "full"


def _selected(sets: list[HeadCells], settings: ExactSettings, solver: str) -> list[HeadCells]:
    if settings.head_patterns is None:
        return sets
    wanted = split_specs(settings.head_patterns)
    have = [short_label(c.pattern, c.params) for c in sets]
    picked = [_match(p, sets, have) for p in wanted]
    if None in picked or len(set(picked)) != len(picked):
        raise SolverError(
            f"head_patterns: {settings.head_patterns!r} must name distinct patterns with head cells in the table "
            f"({','.join(have)}); collect others with `polykv-search collect {CELLS_OPTION} ... --head-patterns`"
        )
    return [c for i, c in enumerate(sets) if i in picked]


def _match(text: str, sets: list[HeadCells], labels: list[str]) -> int | None:
    """The index of the cells ``text`` names: their label as collect, show and the solver print it
    (``kvzip[allocation=model]``), or the bare pattern name of exactly one kind of cells (``kvzip``)."""
    try:
        name, params = parse_spec(text)
    except ValueError:
        return None
    label = short_label(name, params)
    if label in labels:
        return labels.index(label)
    same = [i for i, c in enumerate(sets) if c.pattern == text.strip()]
    return same[0] if len(same) == 1 else None


def _values(cells: HeadCells, settings: ExactSettings, z: float, rule: str) -> np.ndarray:
    """``[L, H, nb]`` cost of each cell under the noise rule."""
    if settings.head_signal == "sum":
        mean = cells.mean["kl_answer"] + cells.mean["kl_prose"]
        se = np.sqrt(np.nan_to_num(cells.se["kl_answer"]) ** 2 + np.nan_to_num(cells.se["kl_prose"]) ** 2)
    else:
        key = f"kl_{settings.head_signal}"
        mean, se = cells.mean[key], np.nan_to_num(cells.se[key])
    if rule == "upper":
        return np.maximum(mean + z * se, 0.0)
    if rule == "interval":
        return np.where(mean - z * se <= 0.0, 0.0, np.maximum(mean, 0.0))
    return np.maximum(mean, 0.0)


def cell_costs(
    problem: Problem, settings: ExactSettings, solver: str
) -> tuple[np.ndarray, list[str], tuple[int, ...], dict]:
    """``(cost [L·H, P, G] with inf for unusable cells, patterns, grid, facts)``: pattern 0 is keep-all
    (``full``, cost 0 at the last grid value n, unusable elsewhere), then one per kind of cells; the grid is
    the union of the cells' usable budgets, then n."""
    sets = head_cell_sets(problem.table)
    if not sets:
        raise SolverError(
            f"{solver} --granularity head: the signal table has no head cells; collect them with "
            f"`polykv-search collect {CELLS_OPTION} ...`"
        )
    if settings.objective not in ("auto", "kl"):
        raise SolverError(f"objective: head cells carry KL only, got {settings.objective!r} (use auto or kl)")
    sets = _selected(sets, settings, solver)
    n = context_length(problem, settings.target_context_len, solver)
    usable = sorted({int(b) for c in sets for b in c.budgets if problem.b_min <= b < n})
    grid = (*usable, n)
    has_se = any(np.isfinite(c.se[k]).any() for c in sets for k in c.se)
    rule = settings.noise if settings.noise != "auto" else ("upper" if has_se else "clip")
    z = float(norm.ppf(0.5 + settings.confidence / 2))
    L, H, _ = sets[0].shape
    cost = np.full((L * H, 1 + len(sets), len(grid)), np.inf)
    cost[:, 0, -1] = 0.0  # keep-all
    for k, cells in enumerate(sets, start=1):
        value = _values(cells, settings, z, rule).reshape(L * H, -1)
        for j, b in enumerate(cells.budgets):
            if b in usable:
                cost[:, k, usable.index(b)] = value[:, j]
    cost[~np.isfinite(cost)] = np.inf  # NaN cells are unusable
    kinds = [
        {"pattern": c.pattern, "params": dict(c.params), "phases": list(c.phases), "budgets": list(c.budgets)}
        for c in sets
    ]
    facts = {"kinds": kinds, "num_kv_heads": H, "context_len": n, "noise": rule, "signal": settings.head_signal}
    facts["z"] = z
    return cost, [KEEP_ALL, *(c.pattern for c in sets)], grid, facts


def _summary(per_head: list[list[tuple[str, int, Any]]], n: int) -> str:
    """``"3 keep all; h2o@64 40, kvzip[allocation=model]@64 20, ..."``: heads per choice, most first."""
    counts: dict[str, int] = {}
    for row in per_head:
        for pattern, budget, params in row:
            key = f"{short_label(pattern, params)}@{budget}"
            counts[key] = counts.get(key, 0) + 1
    full = counts.pop(f"{KEEP_ALL}@{n}", 0)
    rest = ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{full} keep all {n} tokens" + (f"; {rest}" if rest else "")


def solve_heads(problem: Problem, settings: ExactSettings, method: str, phase_solver: PhaseSolver) -> Plan:
    """The head-level problem of the module docstring, solved by ``method``'s ``phase_solver``."""
    cost, patterns, grid, facts = cell_costs(problem, settings, method)
    H, n = facts["num_kv_heads"], facts["context_len"]
    total = head_total(problem, H)
    if cost.shape[0] * grid[0] > total:
        raise SolverError(
            f"infeasible: every (layer, KV head) at the smallest usable budget {grid[0]} needs "
            f"{cost.shape[0] * grid[0]} tokens > H*floor(L*B) = {total}"
        )
    sol = phase_solver(cost, patterns, grid, total)
    optimal = bool(getattr(sol, "optimal", True))
    extra = {k: getattr(sol, k) for k in ("variables", "subsets") if hasattr(sol, k)}
    if hasattr(sol, "message"):
        extra["highs"] = sol.message
    params = {k["pattern"]: k["params"] for k in facts["kinds"]}
    picks = [("full", n, {}) if p == KEEP_ALL else (p, b, params[p]) for p, b in zip(sol.patterns, sol.budgets)]
    per_head = [picks[layer * H : (layer + 1) * H] for layer in range(problem.num_layers)]
    spent = sum(sol.budgets)
    kinds = ",".join(short_label(k["pattern"], k["params"]) for k in facts["kinds"])
    message = (
        f"head level ({kinds} cells): {_summary(per_head, n)} of {len(sol.budgets)} KV heads; optimal "
        f"{facts['signal']} KL (noise={facts['noise']}) = {sol.objective:.6g}; mean budget "
        f"{spent / len(sol.budgets):.4g} of B = {problem.global_budget:g}; tie-break {settings.tie_break}"
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
        "head_cells": facts["kinds"],
        "context_len": n,
        "heads_total": total,
        "rule": "per (layer, KV head): keep-all (cost 0, budget n) or a (pattern, budget) head cell; sum of head "
        "budgets <= H*floor(L*B); decoding follows prefill's heads",
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
