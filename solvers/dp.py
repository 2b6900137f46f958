"""``dp``: the exact dynamic program for the ``ilp`` problem (same inputs, same optimum).

Per optimized phase: a layer's best pattern at each grid budget does not depend on the other
layers, so first ``c[l, b] = min_r cost[l, r, b]`` (ties to the pattern listed first), then a
knapsack over layers with the state "budget used so far"::

    f_0(0) = 0;   f_l(s) = min_b  f_{l-1}(s − w_b) + c[l, b];   f* = min_{s <= S} f_L(s)

with ``w_b = (b − b_lo)/g`` (``b_lo`` = smallest usable grid value, ``g`` = gcd of the offsets) and
``S = (floor(L·B) − L·b_lo)/g``, so the table has ``L × (S+1)`` entries, vectorized over ``s``.
Time ``O(L · G · S)``. ``f_L(s)`` is the least cost of using *exactly* ``s``, so the tie-break
(:mod:`solvers.exact`) is exact: among the totals with ``f_L(s) <= f* + slack``, ``spend`` takes
the largest and ``save`` the smallest, and the path to it is the cheapest at that total (ties to
the smaller budget per layer).

``max_distinct_budgets=k`` (at most k distinct budget values per phase) is handled exactly by
running the DP on every k-subset of the usable grid (a restriction to fewer values is covered by a
superset) and keeping the best; ``C(G, k)`` DPs, refused above ``max_subsets`` (use ``ilp``).
``granularity="head"`` (``--granularity head``) runs the same knapsack with one item per (layer, KV
head): keep-all or a (pattern, budget) cell from the table's head cells (:mod:`solvers.head_exact`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from itertools import combinations

import numpy as np

from solvers.base import Plan, Problem, Solver, SolverError, setting
from solvers.exact import ExactSettings, cost_provenance, describe, phase_costs, tie_slack
from solvers.head_exact import solve_heads

#: The most ``max_subsets``: each subset is one DP over the whole table; 50 times the default.
MAX_SUBSETS = 1_000_000


@dataclass(frozen=True)
class DPSettings(ExactSettings):
    max_subsets: int = setting(
        20000,
        f"refuse max_distinct_budgets when C(grid, k) exceeds this (use ilp; at most {MAX_SUBSETS:,})",
        most=MAX_SUBSETS,
    )

    def check(self) -> None:
        super().check()
        if self.max_subsets < 1:
            raise SolverError(f"max_subsets: must be >= 1, got {self.max_subsets}")


@dataclass
class _Table:
    """One knapsack: least cost ``f[s]`` of using exactly ``totals[s]`` tokens, and the choices."""

    f: np.ndarray
    totals: np.ndarray
    choice: np.ndarray
    w: np.ndarray

    def picks(self, s: int) -> list[int]:
        out = [0] * self.choice.shape[0]
        for layer in range(self.choice.shape[0] - 1, -1, -1):
            j = int(self.choice[layer, s])
            out[layer] = j
            s -= int(self.w[j])
        return out


def _knapsack(best: np.ndarray, values: np.ndarray, total: int) -> _Table | None:
    """The DP table of ``min Σ_l best[l, j_l]`` over exact totals ``Σ values[j_l] <= total``."""
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
    if not np.isfinite(f).any():
        return None
    return _Table(f, L * v0 + g * np.arange(S), choice, w)


@dataclass
class PhaseSolution:
    patterns: list[str]
    budgets: list[int]
    objective: float
    subsets: int


def solve_phase_dp(
    cost: np.ndarray,
    patterns: list[str],
    grid: tuple[int, ...],
    total: int,
    k: int | None = None,
    max_subsets: int = 20000,
    tie_break: str | None = None,
    tie_tolerance: float = 0.0,
) -> PhaseSolution:
    """One phase: ``cost`` is ``(L, P, G)`` with ``inf`` for unavailable cells. ``tie_break``:
    None (the optimum with the smallest total), ``"spend"`` or ``"save"``."""
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
    tables = []
    for sub in subsets:
        idx = np.asarray(sub)
        table = _knapsack(best[:, idx], values[idx], total)
        if table is not None:
            tables.append((sub, table))
    if not tables:
        raise SolverError("dp: no feasible assignment (every layer needs a usable cell within L*B)")
    optimum = min(float(t.f.min()) for _, t in tables)
    # without a tie-break: the exact optimum with the smallest total (as the DP always did)
    limit = optimum + tie_slack(optimum, tie_tolerance) if tie_break is not None else optimum
    sign = -1 if tie_break == "spend" else 1
    candidates = [
        ((sign * int(t.totals[s]), float(t.f[s]), i), sub, t, int(s))
        for i, (sub, t) in enumerate(tables)
        for s in np.flatnonzero(t.f <= limit)
    ]
    _, sub, table, s = min(candidates, key=lambda c: c[0])
    gs = [sub[j] for j in table.picks(s)]
    pats = [patterns[int(arg[l, g])] for l, g in enumerate(gs)]
    buds = [int(grid[g]) for g in gs]
    obj = float(sum(best[l, g] for l, g in enumerate(gs)))
    return PhaseSolution(pats, buds, obj, len(subsets))


class DPSolver(Solver):
    name = "dp"
    description = "exact dynamic program for the ilp problem (knapsack over layers); agrees with ilp"
    needs_table = True
    Settings = DPSettings
    settings: DPSettings

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        if s.granularity == "head":  # solvers.head_exact: one item per (layer, KV head)
            return solve_heads(
                problem,
                s,
                self.name,
                lambda cost, patterns, grid, total: solve_phase_dp(
                    cost, patterns, grid, total, s.max_distinct_budgets, s.max_subsets, s.tie_break, s.tie_tolerance
                ),
            )
        choices, info, objective, unused = {}, {}, 0.0, {}
        for phase in problem.phases:
            cost, names, grid = phase_costs(problem, phase, s)
            sol = solve_phase_dp(
                cost, names, grid, problem.total, s.max_distinct_budgets, s.max_subsets, s.tie_break, s.tie_tolerance
            )
            choices[phase] = list(zip(sol.patterns, sol.budgets))
            unused[phase] = problem.total - sum(sol.budgets)
            info[phase] = {"objective": sol.objective, "subsets": sol.subsets}
            objective += sol.objective
        message = describe(s, problem, objective, unused)
        return Plan(choices, objective=objective, message=message, info=info, provenance=cost_provenance(s, problem))
