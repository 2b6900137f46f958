"""``ilp``: exact cell selection by mixed-integer programming (``scipy.optimize.milp`` / HiGHS).

Per optimized phase φ, binary ``x[l, r, b]`` for every available cell (allowed pattern r, grid
budget b in [b_min, max_budget], finite table value)::

    minimize   Σ c[l, r, b] · x[l, r, b]          c = cost of the cell (solvers.exact: objective, noise rule)
    subject to Σ_{r,b} x[l, r, b] = 1              for every layer l
               Σ b · x[l, r, b] <= floor(L·B)
    optional   Σ_r x[l, r, b] <= y[b],  Σ_b y[b] <= k      (at most k distinct budget values)

The phases share no constraint, so each is its own MILP, solved by HiGHS with a zero relative gap
(HiGHS's absolute gap is 1e-6); the reported objective is recomputed from the chosen cells.
``dp`` solves the same problem and must agree. The tie-break (:mod:`solvers.exact`) adds two MILPs
per phase on the pattern-dominated cells: ``min ∓Σ b·x`` subject to ``Σ c·x <= optimum + slack``,
then ``min Σ c·x`` at that ``Σ b`` (the second only when ``tie_tolerance > 0``; both skipped when the
first solution already spends all it can, or saves all it can).

Exact presolve (``reduce=True``, the default; ``reduce=False`` makes every available cell a
variable), see :func:`reduce_cells`:

1. pattern dominance: at one (layer, budget) only the cheapest pattern can matter;
2. budget dominance (without the k constraint): a cell costing no less than a smaller budget of
   the same layer can be swapped for it;
3. reduced-cost fixing (without the k constraint): with the Lagrangian bound
   ``LB = max_λ≥0 Σ_l min_b (c[l,b] + λ·b) − λ·T`` and a feasible incumbent of value ``Z`` (greedy
   at the bound's λ, improved by single and pair moves), any solution using cell (l, b) costs at
   least ``LB + rc[l,b]`` (``rc`` = its reduced cost), so cells with ``LB + rc > Z`` are dropped; the
   incumbent's own cells always stay, so the reduced MILP keeps the optimum. A cutoff row
   ``Σ c·x <= Z`` is added.
``granularity="head"`` (``--granularity head``) solves the head-level problem instead: one item per
(layer, KV head), keep-all or a (pattern, budget) cell from the table's head cells (:mod:`solvers.head_exact`,
the same MILP with keep-all as one more "pattern").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from solvers.base import Plan, Problem, Solver, SolverError, setting
from solvers.exact import ExactSettings, cost_provenance, describe, phase_costs, tie_slack
from solvers.head_exact import solve_heads


@dataclass(frozen=True)
class ILPSettings(ExactSettings):
    time_limit: float = setting(60.0, "HiGHS time limit per phase in seconds")
    reduce: bool = setting(True, "exact presolve (dominance, reduced-cost fixing) before the MILP")

    def check(self) -> None:
        super().check()
        if self.time_limit <= 0:
            raise SolverError(f"time_limit: must be > 0, got {self.time_limit:g}")


@dataclass
class PhaseSolution:
    patterns: list[str]
    budgets: list[int]
    objective: float
    optimal: bool
    message: str
    variables: int = 0


# ------------------------------------------------------------------------- presolve
def _improve(best: np.ndarray, v: np.ndarray, total: float, cur: np.ndarray) -> np.ndarray:
    """Local search on a feasible assignment ``cur`` (grid index per layer): best single move or
    pair of moves (two different layers) that lowers the cost and keeps Σ v <= total."""
    L, G = best.shape
    rows = np.arange(L)
    fin = np.isfinite(best)
    for _ in range(4 * L * G):
        slack = total - v[cur].sum()
        gain = np.where(fin, best[rows, cur][:, None] - best, -np.inf)
        extra = v[None, :] - v[cur][:, None]
        single = np.where(extra <= slack, gain, -np.inf)
        idx = np.flatnonzero(np.isfinite(gain.reshape(-1)) & (gain.reshape(-1) > -np.inf))
        ga, ea, la = gain.reshape(-1)[idx], extra.reshape(-1)[idx], idx // G
        pair = ga[:, None] + ga[None, :]
        ok = (ea[:, None] + ea[None, :] <= slack) & (la[:, None] != la[None, :])
        pair = np.where(ok, pair, -np.inf)
        bs = single.max()
        bp = pair.max() if pair.size else -np.inf
        if max(bs, bp) <= 1e-12:
            break
        if bs >= bp:
            l, g = np.unravel_index(int(np.argmax(single)), single.shape)
            cur[l] = g
        else:
            i, j = np.unravel_index(int(np.argmax(pair)), pair.shape)
            cur[la[i]] = idx[i] % G
            cur[la[j]] = idx[j] % G
    return cur


def reduced_cost_keep(best: np.ndarray, values: np.ndarray, total: int) -> tuple[np.ndarray, float | None]:
    """Reduced-cost fixing for ``min Σ best[l, g_l] s.t. Σ values[g_l] <= total`` (``best`` is
    ``(L, G)`` with ``inf`` for unavailable cells). Returns the ``(L, G)`` mask of cells that may
    be in an optimal solution and the incumbent value (None when no fixing was done)."""
    L, G = best.shape
    v = values.astype(np.float64)
    fin = np.isfinite(best)

    def pick(lam: float) -> tuple[np.ndarray, np.ndarray]:
        s = np.where(fin, best + lam * v, np.inf)
        return s.min(axis=1), np.argmin(s, axis=1)  # ties -> smaller budget (grid is increasing)

    _, j0 = pick(0.0)
    if v[j0].sum() <= total or G < 2:
        return fin, None  # the unconstrained optimum fits (or nothing to trade): nothing to fix
    finite = best[fin]
    lo, hi = 0.0, float(finite.max() - finite.min()) / float(np.diff(v).min()) + 1.0
    if v[pick(hi)[1]].sum() > total:
        return fin, None  # infeasible or degenerate; let the MILP report it
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if v[pick(mid)[1]].sum() <= total:
            hi = mid
        else:
            lo = mid
    bound, lam = max(((pick(x)[0].sum() - x * total, x) for x in (lo, hi)), key=lambda t: t[0])
    cur = _improve(best, v, total, pick(hi)[1].copy())
    incumbent = float(best[np.arange(L), cur].sum())
    m, _ = pick(lam)
    rc = np.where(fin, best + lam * v, np.inf) - m[:, None]
    keep = fin & (bound + rc <= incumbent + 1e-9 * max(1.0, abs(incumbent)))
    keep[np.arange(L), cur] = True  # the incumbent always survives (guards against rounding)
    return keep, incumbent


def reduce_cells(cost: np.ndarray, grid: tuple[int, ...], total: int, k: int | None) -> tuple[np.ndarray, float | None]:
    """Mask ``(L, P, G)`` of cells kept by the exact presolve (module docstring) and the incumbent
    value when reduced-cost fixing ran."""
    L, P, G = cost.shape
    best = cost.min(axis=1)  # (L, G)
    arg = cost.argmin(axis=1)  # first cheapest pattern
    keep_lg = np.isfinite(best)
    incumbent = None
    if k is None or k >= G:
        running = np.full(L, np.inf)
        for g in np.argsort(np.asarray(grid), kind="stable"):  # increasing budget: strict improvements only
            keep_lg[:, g] &= best[:, g] < running
            running = np.minimum(running, best[:, g])
        masked = np.where(keep_lg, best, np.inf)
        keep_lg, incumbent = reduced_cost_keep(masked, np.asarray(grid), total)
    keep = np.zeros(cost.shape, dtype=bool)
    keep[np.arange(L)[:, None], arg, np.arange(G)[None, :]] = keep_lg
    return keep, incumbent


# ---------------------------------------------------------------------------- MILP
def _run_milp(cost, avail, grid, total, k, time_limit, seed, *, objective="cost", cost_cap=None, spend_bound=None):
    """One MILP over the cells in ``avail``: minimize the cost (``objective="cost"``), −Σ b
    (``"spend"``) or Σ b (``"save"``), with the optional rows ``Σ c·x <= cost_cap`` and, for
    ``spend_bound=("spend", s)`` / ``("save", s)``, ``Σ b·x >= s`` / ``Σ b·x <= s``."""
    L, P, G = cost.shape
    cells = np.argwhere(avail)  # rows (l, p, g), C order: deterministic
    n = len(cells)
    values = np.asarray(grid, dtype=np.float64)
    use_k = k is not None and k < G
    n_var = n + (G if use_k else 0)
    cvec = cost[avail]
    vvec = values[cells[:, 2]]
    obj = np.zeros(n_var)
    obj[:n] = {"cost": cvec, "spend": -vvec, "save": vvec}[objective]
    rows: list = [cells[:, 0].tolist()]
    cols: list = [list(range(n))]
    data: list = [[1.0] * n]
    lb, ub = [1.0] * L, [1.0] * L  # one cell per layer
    r = L

    def add_row(coef, low, high):
        nonlocal r
        rows.append([r] * n)
        cols.append(list(range(n)))
        data.append(list(coef))
        lb.append(low)
        ub.append(high)
        r += 1

    add_row(vvec, -np.inf, float(total))  # the budget
    if cost_cap is not None:
        add_row(cvec, -np.inf, cost_cap)
    if spend_bound is not None:
        kind, bound = spend_bound
        add_row(vvec, bound, np.inf) if kind == "spend" else add_row(vvec, -np.inf, bound)
    if use_k:  # Σ_p x[l,p,g] - y[g] <= 0 for every used (l, g); Σ y <= k
        lg = cells[:, 0] * G + cells[:, 2]
        uniq, inv = np.unique(lg, return_inverse=True)
        rows += [(r + inv).tolist(), (r + np.arange(len(uniq))).tolist()]
        cols += [list(range(n)), (n + uniq % G).tolist()]
        data += [[1.0] * n, [-1.0] * len(uniq)]
        lb += [-np.inf] * len(uniq)
        ub += [0.0] * len(uniq)
        r += len(uniq)
        rows.append([r] * G)
        cols.append(list(range(n, n + G)))
        data.append([1.0] * G)
        lb.append(-np.inf)
        ub.append(float(k))
        r += 1
    A = coo_matrix((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))), shape=(r, n_var)).tocsr()
    with warnings.catch_warnings():  # random_seed is passed to HiGHS verbatim (scipy warns about that)
        warnings.simplefilter("ignore", RuntimeWarning)
        res = milp(
            obj,
            constraints=LinearConstraint(A, lb, ub),
            integrality=np.ones(n_var),
            bounds=Bounds(0, 1),
            options={"mip_rel_gap": 0.0, "time_limit": time_limit, "random_seed": int(seed) % 2**31},
        )
    if res.x is None:
        raise SolverError(f"ilp: no feasible assignment ({res.message.strip()})")
    picked = cells[res.x[:n] > 0.5]
    if len(picked) != L or sorted(picked[:, 0].tolist()) != list(range(L)):
        raise SolverError("ilp: HiGHS returned a solution that does not pick one cell per layer")
    return picked[np.argsort(picked[:, 0])], res.status == 0, res.message.strip(), n_var


def _pattern_dominated(cost: np.ndarray) -> np.ndarray:
    """Mask keeping, per (layer, budget), only the first cheapest usable pattern."""
    L, P, G = cost.shape
    keep = np.zeros(cost.shape, dtype=bool)
    keep[np.arange(L)[:, None], cost.argmin(axis=1), np.arange(G)[None, :]] = np.isfinite(cost.min(axis=1))
    return keep


def solve_phase_ilp(
    cost: np.ndarray,
    patterns: list[str],
    grid: tuple[int, ...],
    total: int,
    k: int | None,
    time_limit: float,
    reduce: bool = True,
    seed: int = 0,
    tie_break: str | None = None,
    tie_tolerance: float = 0.0,
) -> PhaseSolution:
    """One phase: ``cost`` is ``(L, P, G)`` with ``inf`` for unavailable cells. ``tie_break``:
    None (any optimum), ``"spend"`` or ``"save"`` (module docstring of :mod:`solvers.exact`)."""
    L, P, G = cost.shape
    avail = np.isfinite(cost)
    for layer in range(L):
        if not avail[layer].any():
            raise SolverError(f"signals: layer {layer} has no usable cell (all missing for the allowed patterns/grid)")
    first = avail
    incumbent = None
    if reduce:
        keep, incumbent = reduce_cells(cost, grid, total, k)
        first = avail & keep
    cap = None if incumbent is None else incumbent + 1e-9 * max(1.0, abs(incumbent))
    picked, optimal, message, n_var = _run_milp(cost, first, grid, total, k, time_limit, seed, cost_cap=cap)
    optimum = float(sum(cost[l, p, g] for l, p, g in picked))
    if tie_break is not None and optimal:
        values = np.asarray(grid)
        usable = np.isfinite(cost.min(axis=1))  # (L, G)
        spent = int(values[picked[:, 2]].sum())
        bound = [values[usable[l]].max() if tie_break == "spend" else values[usable[l]].min() for l in range(L)]
        done = spent == (min(total, int(sum(bound))) if tie_break == "spend" else int(sum(bound)))
        if not done:
            dominated = _pattern_dominated(cost)
            slack = optimum + tie_slack(optimum, tie_tolerance)
            picked, optimal, message, _ = _run_milp(
                cost, dominated, grid, total, k, time_limit, seed, objective=tie_break, cost_cap=slack
            )
            if tie_tolerance > 0 and optimal:
                spent = int(values[picked[:, 2]].sum())
                picked, optimal, message, _ = _run_milp(
                    cost, dominated, grid, total, k, time_limit, seed, cost_cap=slack, spend_bound=(tie_break, spent)
                )
    pats = [patterns[p] for p in picked[:, 1]]
    buds = [int(grid[g]) for g in picked[:, 2]]
    obj = float(sum(cost[l, p, g] for l, p, g in picked))
    return PhaseSolution(pats, buds, obj, optimal, message, n_var)


class ILPSolver(Solver):
    name = "ilp"
    description = "exact MILP (scipy/HiGHS): one (pattern, budget) grid cell per layer minimizing predicted degradation"
    needs_table = True
    Settings = ILPSettings
    settings: ILPSettings

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        if s.granularity == "head":  # solvers.head_exact: one item per (layer, KV head)
            return solve_heads(
                problem,
                s,
                self.name,
                lambda cost, patterns, grid, total: solve_phase_ilp(
                    cost,
                    patterns,
                    grid,
                    total,
                    s.max_distinct_budgets,
                    s.time_limit,
                    s.reduce,
                    problem.seed,
                    s.tie_break,
                    s.tie_tolerance,
                ),
            )
        choices, info, objective, optimal, msgs, unused = {}, {}, 0.0, True, [], {}
        for phase in problem.phases:
            cost, names, grid = phase_costs(problem, phase, s)
            sol = solve_phase_ilp(
                cost,
                names,
                grid,
                problem.total,
                s.max_distinct_budgets,
                s.time_limit,
                s.reduce,
                problem.seed,
                s.tie_break,
                s.tie_tolerance,
            )
            choices[phase] = list(zip(sol.patterns, sol.budgets))
            unused[phase] = problem.total - sum(sol.budgets)
            info[phase] = {
                "objective": sol.objective,
                "optimal": sol.optimal,
                "variables": sol.variables,
                "highs": sol.message,
            }
            objective += sol.objective
            optimal &= sol.optimal
            if not sol.optimal:
                msgs.append(f"{phase}: {sol.message}")
        message = describe(s, problem, objective, unused) if optimal else "not proven optimal: " + "; ".join(msgs)
        provenance = cost_provenance(s, problem)
        return Plan(choices, objective=objective, message=message, success=optimal, info=info, provenance=provenance)
