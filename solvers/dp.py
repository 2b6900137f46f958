"""``dp``: the exact dynamic program for the ``ilp`` problem (same inputs, same optimum).

Per optimized phase: a layer's best pattern at each grid budget does not depend on the other
layers, so first ``c[l, b] = min_r cost[l, r, b]`` (ties to the pattern listed first), then a
knapsack over layers with the state "budget used so far"::

    f_0(0) = 0;   f_l(s) = min_b  f_{l-1}(s − w_b) + c[l, b];   answer = min_{s <= S} f_L(s)

with ``w_b = (b − b_lo)/g`` (``b_lo`` = smallest usable grid value, ``g`` = gcd of the offsets) and
``S = (floor(L·B) − L·b_lo)/g``, so the table has ``L × (S+1)`` entries, vectorized over ``s``.
Time ``O(L · G · S)``; ties go to the smaller budget and the smaller total.

``max_distinct_budgets=k`` (at most k distinct budget values per phase) is handled exactly by
running the DP on every k-subset of the usable grid (a restriction to fewer values is covered by a
superset) and keeping the best; ``C(G, k)`` DPs, refused above ``max_subsets`` (use ``ilp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from itertools import combinations

import numpy as np

from solvers.base import OBJECTIVES, Plan, Problem, Settings, Solver, SolverError, cost_tensor, setting


@dataclass(frozen=True)
class DPSettings(Settings):
    objective: str = setting("dppl", "predicted degradation to minimize", OBJECTIVES)
    max_distinct_budgets: int | None = setting(None, "at most k distinct budget values per phase (exact, by subsets)")
    max_subsets: int = setting(20000, "refuse max_distinct_budgets when C(grid, k) exceeds this (use ilp)")

    def check(self) -> None:
        if self.max_distinct_budgets is not None and self.max_distinct_budgets < 1:
            raise SolverError(f"max_distinct_budgets: must be >= 1, got {self.max_distinct_budgets}")
        if self.max_subsets < 1:
            raise SolverError(f"max_subsets: must be >= 1, got {self.max_subsets}")


def _knapsack(best: np.ndarray, values: np.ndarray, total: int) -> tuple[float, list[int]] | None:
    """Min Σ_l best[l, j_l] s.t. Σ values[j_l] <= total; returns (objective, j per layer) or None."""
    L, G = best.shape
    v0 = int(values.min())
    cap = total - L * v0
    if cap < 0:
        return None
    offs = (values - v0).astype(np.int64)
    g = reduce(math.gcd, offs.tolist(), 0) or 1
    w = offs // g
    S = min(cap // g, L * int(w.max())) + 1
    f = np.full(S, np.inf)
    f[0] = 0.0
    choice = np.full((L, S), -1, dtype=np.int16 if G < 32767 else np.int32)
    for layer in range(L):
        new = np.full(S, np.inf)
        ch = choice[layer]
        for j in range(G):
            c = best[layer, j]
            if not np.isfinite(c):
                continue
            wj = int(w[j])
            if wj >= S:
                continue
            cand = f[: S - wj] + c
            seg = new[wj:]
            better = cand < seg
            seg[better] = cand[better]
            ch[wj:][better] = j
        f = new
    s = int(np.argmin(f))
    if not np.isfinite(f[s]):
        return None
    picks = [0] * L
    for layer in range(L - 1, -1, -1):
        j = int(choice[layer, s])
        picks[layer] = j
        s -= int(w[j])
    return float(f.min()), picks


@dataclass
class PhaseSolution:
    patterns: list[str]
    budgets: list[int]
    objective: float
    subsets: int


def solve_phase_dp(
    cost: np.ndarray, patterns: list[str], grid: tuple[int, ...], total: int, k: int | None = None, max_subsets: int = 20000
) -> PhaseSolution:
    """One phase: ``cost`` is ``(L, P, G)`` with ``inf`` for unavailable cells."""
    L, P, G = cost.shape
    for layer in range(L):
        if not np.isfinite(cost[layer]).any():
            raise SolverError(f"signals: layer {layer} has no usable cell (all missing for the allowed patterns/grid)")
    best = cost.min(axis=1)  # (L, G)
    arg = cost.argmin(axis=1)  # first minimum = first listed pattern
    values = np.asarray(grid, dtype=np.int64)
    if k is None or k >= G:
        subsets = [tuple(range(G))]
    else:
        n = math.comb(G, k)
        if n > max_subsets:
            raise SolverError(f"dp: C({G}, {k}) = {n} budget subsets exceeds max_subsets={max_subsets}; use ilp")
        subsets = list(combinations(range(G), k))
    found: tuple[float, tuple[int, ...], list[int]] | None = None
    for sub in subsets:
        idx = np.asarray(sub)
        res = _knapsack(best[:, idx], values[idx], total)
        if res is not None and (found is None or res[0] < found[0]):
            found = (res[0], sub, res[1])
    if found is None:
        raise SolverError("dp: no feasible assignment (every layer needs a usable cell within L*B)")
    _, sub, picks = found
    gs = [sub[j] for j in picks]
    pats = [patterns[int(arg[l, g])] for l, g in enumerate(gs)]
    buds = [int(grid[g]) for g in gs]
    obj = float(sum(best[l, g] for l, g in enumerate(gs)))
    return PhaseSolution(pats, buds, obj, len(subsets))


class DPSolver(Solver):
    name = "dp"
    description = "exact dynamic program for the ilp problem (knapsack over layers); agrees with ilp"
    needs_table = True
    Settings = DPSettings

    def _solve(self, problem: Problem) -> Plan:
        table = problem.require_table(self.name)
        grid = problem.selection_grid()
        pidx = problem.pattern_indices()
        names = [table.patterns[i] for i in pidx]
        gidx = [table.budget_index(b) for b in grid]
        choices, info, objective = {}, {}, 0.0
        for phase in problem.phases:
            cost = cost_tensor(table, phase, self.settings.objective, pidx, gidx)
            sol = solve_phase_dp(cost, names, grid, problem.total, self.settings.max_distinct_budgets, self.settings.max_subsets)
            choices[phase] = list(zip(sol.patterns, sol.budgets))
            info[phase] = {"objective": sol.objective, "subsets": sol.subsets}
            objective += sol.objective
        return Plan(choices, objective=objective, message=f"optimal {self.settings.objective} = {objective:.6g}", info=info)
