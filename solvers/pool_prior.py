"""``pool-prior``: static per-layer weights over KVzip's model-wide pool, chosen on calibration samples.

KVzip's pool (``kvzip[allocation=model]``) adapts per prompt: every layer's tokens are ranked together at the sum
of the layers' budgets. The signal table knows which layers hurt most when they lose tokens. This solver lets that
knowledge steer the pool without replacing it (issue 59, "static priors over the dynamic pool"): every layer keeps
the pool's pattern at ``floor(B)``, with a pool prior ``weight`` (:class:`~polykv_search.patterns.kvzip.KVzip`: its
scores enter the ranking multiplied by it)

    ``w_l(alpha) = ((s_l + eps) / mean(s + eps)) ** alpha``,  ``eps = smoothing * mean(s)``,

where ``s_l`` is the layer's *importance*: the table's cost of compressing layer ``l`` alone with the pool's own
per-head pattern (its ``alone()`` variant, the cells ``collect`` measures for it), averaged over the grid budgets
up to the reference budget (default: the grid value closest to B, so the tight ones), with the noise rule
``clip`` (a cell never counts below FullKV). Without such cells, the worst case over the table's patterns is used
(recorded in ``importance_from``). Weights are rounded to 3 significant digits (the spec written is the one
measured).

Choice of ``alpha``: the plain pool (``alpha = 0``, weights 1) is the start. It and every ``alpha`` of the grid
are measured with the whole-model search's objective (:mod:`solvers.search_objective`: KL(FullKV ‖ strategy) on
each calibration sample's scored span, whole model, both phases; samples drawn like the guard's from the table's
calibration split, never evaluation data), and an ``alpha`` replaces the plain pool only by the guard's rule
(:func:`solvers.guard.decide`: its paired difference to the plain pool, BCa stratified by sample kind, lies
entirely below 0 at the Bonferroni level over the grid; among those, the lowest mean KL). So the result is the
plain pool or resolved better than it on the calibration samples. Every value is journaled (``solve``: ``OUT.
journal``): a killed solve rerun with the same command measures nothing twice.

The default grid stays at or below 1: a layer's importance can be ten times the mean (layer 23 of SmolLM2 in
``studies/kvzip/h19-signals.json.xz``), so ``alpha = 1`` already spans weights 0.11 to 11.2 there.

Cost: ``len(alphas) + 1`` strategies (fewer when two alphas give the same weights) on ``samples`` samples, each
sample's FullKV reference once; batched, one call of the scoring engine per sample.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from polykv_search.patterns import make_pattern, pattern_spec, spec_label
from signals.predict import cell_costs
from signals.table import SignalTableError
from solvers.base import Plan, Problem, SolverError, setting
from solvers.guard import decide
from solvers.problem import layer_choice
from solvers.whole_model import MeasureSettings, WholeModelSolver
from strategies import PHASES, Strategy


@dataclass(frozen=True)
class PoolPriorSettings(MeasureSettings):
    pattern: str = setting("kvzip[allocation=model]", "the pooled pattern every layer uses (allocation=model)")
    alphas: str = setting("0.25,0.5,1", "exponents tried, comma separated: w_l = (importance_l / mean)^alpha")
    signal: str = setting("auto", "importance: the table's kl (auto, when it has it) or dppl", ("auto", "kl", "dppl"))
    reference_budget: int | None = setting(
        None, "importance: mean over the grid budgets up to this one (default: the grid value closest to B)"
    )
    smoothing: float = setting(0.1, "added to every importance as a share of their mean (keeps weights finite)")

    def check(self) -> None:
        super().check()
        self.grid()
        if not 0.0 < self.smoothing <= 10.0:
            raise SolverError(f"smoothing: must be in (0, 10], got {self.smoothing:g}")
        try:
            name, params = pattern_spec(self.pattern)
            pool = make_pattern(name, **params)
        except (ValueError, TypeError) as err:
            raise SolverError(f"pattern: {str(err).splitlines()[0]}") from None
        if pool.pooled != "model" or not pool.prior.plain:
            raise SolverError(f"pattern: a model-wide pool without a prior (allocation=model), got {self.pattern!r}")

    def grid(self) -> list[float]:
        """The exponents of ``alphas`` other than 0, in order, each once."""
        out: list[float] = []
        for part in filter(None, (p.strip() for p in self.alphas.split(","))):
            try:
                value = float(part)
            except ValueError:
                raise SolverError(f"alphas: {part!r} is not a number") from None
            if not np.isfinite(value) or abs(value) > 8:
                raise SolverError(f"alphas: each must be a number in [-8, 8], got {part!r}")
            if value != 0 and value not in out:
                out.append(value)
        if not out:
            raise SolverError(f"alphas: give at least one exponent other than 0, got {self.alphas!r}")
        return out


def layer_importance(problem: Problem, pool, signal: str, reference: int | None) -> tuple[dict[str, list], str]:
    """Per optimized phase, each layer's importance (module docstring), and what it was read from."""
    table = problem.table
    assert table is not None
    if signal == "auto":
        signal = "kl" if "kl" in table.signals else "dppl"
    try:
        costs = cell_costs(table, signal, "clip")
    except SignalTableError as err:
        raise SolverError(str(err)) from None
    ref = problem.reference_budget(reference)
    budgets = [g for g, b in enumerate(table.budgets) if b <= ref]
    own = [i for i, p in enumerate(table.patterns) if _alone(p) == pool.alone()]
    out = {}
    for phase in problem.phases:  # type: ignore[union-attr]
        sub = costs[:, table.phase_index(phase)][:, :, budgets]  # (L, P, G)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN layer is reported below instead
            values = np.nanmean(sub[:, own], axis=(1, 2)) if own else np.nanmax(np.nanmean(sub, axis=2), axis=1)
        missing = [layer for layer, v in enumerate(values) if not np.isfinite(v)]
        if missing:
            raise SolverError(f"signals: no {signal} cells up to budget {ref} for {phase} layers {missing}")
        out[phase] = [float(v) for v in values]
    what = f"{signal} of {', '.join(table.patterns[i] for i in own)}" if own else f"{signal}, worst pattern"
    return out, f"{what}, mean over budgets {[table.budgets[g] for g in budgets]} (noise rule clip)"


def prior_weights(importance, alpha: float, smoothing: float) -> list[float]:
    """``w_l = ((s_l + eps) / mean(s + eps)) ** alpha`` with ``eps = smoothing * mean(s)``, 3 significant digits
    (all 1 when every importance is 0)."""
    s = np.asarray(importance, dtype=np.float64)
    x = s + smoothing * s.mean()
    if not x.mean() > 0:
        return [1.0] * len(s)
    return [float(f"{w:.3g}") for w in (x / x.mean()) ** alpha]


class PoolPriorSolver(WholeModelSolver):
    name = "pool-prior"
    description = (
        "per-layer weights on KVzip's model-wide pool from the table's importance, the exponent chosen on "
        "calibration samples; kept only when resolved better than the plain pool"
    )
    needs_table = True
    Settings = PoolPriorSettings

    def _planned(self) -> int:
        return len(self.settings.grid()) + 1

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        begin = time.perf_counter()
        name, params = pattern_spec(s.pattern)
        importance, source = layer_importance(problem, make_pattern(name, **params), s.signal, s.reference_budget)
        b = problem.uniform_budget
        if problem.num_layers * b > problem.total or b < problem.b_min:
            raise SolverError(f"infeasible: floor(B) = {b} in every layer breaks b_min={problem.b_min}")
        specs: dict[str, dict[str, list[str]]] = {}
        for alpha in [0.0, *s.grid()]:
            per_phase = {
                phase: [_spec(name, params, w) for w in prior_weights(values, alpha, s.smoothing)]
                for phase, values in importance.items()
            }
            if per_phase not in specs.values():  # two exponents with the same weights are measured once
                specs[_label(alpha)] = per_phase
        names = list(specs)
        strategies = [_strategy(problem, specs[n], b) for n in names]
        if len(strategies) == 1:  # before the model is loaded
            raise SolverError("pool-prior: every exponent gives the plain pool (the importances are all equal)")
        with self._objective(problem) as (objective, kinds, described):
            values = objective(strategies)
        g = decide(values, names, kinds, level=s.level, seed=s.seed)
        chosen = g.chosen
        self.trace = _Chosen(strategies[names.index(chosen)])
        cost = objective.cost() if hasattr(objective, "cost") else {}
        cost["wall_s"] = round(time.perf_counter() - begin, 3)
        record = {
            **g.to_json(),
            "start": names[0],
            "importance": importance,
            "importance_from": source,
            "weights": {n: {p: [_weight(x) for x in v] for p, v in specs[n].items()} for n in names},
            "samples": described,
            "cost": cost,
            "settings": s.to_json(),
        }
        return Plan(
            {phase: [(spec, b) for spec in v] for phase, v in specs[chosen].items()},
            objective=float(g.means[chosen].estimate),
            message=_message(g, names[0], cost),
            info={"pool_prior": record},
            provenance={"pool_prior": record},
        )


@dataclass(frozen=True)
class _Chosen:
    """What :meth:`WholeModelSolver.solve` checks the written strategy against."""

    result: Strategy


def _alone(spec: str):
    try:
        name, params = pattern_spec(spec)
        return make_pattern(name, **params).alone()
    except (ValueError, TypeError, KeyError):
        return None


def _spec(name: str, params: dict[str, Any], weight: float) -> str:
    return spec_label(name, params if weight == 1.0 else {**params, "weight": weight})


def _weight(spec: str) -> float:
    return float(pattern_spec(spec)[1].get("weight", 1.0))


def _label(alpha: float) -> str:
    return "plain-pool" if alpha == 0 else f"alpha={alpha:g}"


def _strategy(problem: Problem, specs: dict[str, list[str]], budget: int) -> Strategy:
    """The strategy :meth:`Solver.solve` writes for these choices (its provenance aside)."""
    default = layer_choice(problem.default_pattern, problem.uniform_budget)
    per_phase = {
        p: [layer_choice(x, budget) for x in specs[p]] if p in specs else [default] * problem.num_layers for p in PHASES
    }
    return Strategy(per_phase["prefill"], per_phase["decoding"], problem.global_budget, problem.b_min, {})


def _message(g, start: str, cost: dict[str, Any]) -> str:
    if g.replaced:
        iv = g.versus[g.chosen]
        line = f"{g.chosen} kept: KL − {start} {iv.estimate:+.4g} [{iv.low:+.4g}, {iv.high:+.4g}]"
    else:
        line = f"the {start} kept (no exponent resolved better)"
    runs = ""
    if "strategy_runs" in cost:
        runs = f"; {cost['strategy_runs']} strategy runs, {cost['forward_calls']} model calls"
    return f"{line}, {len(g.names)} strategies measured{runs}, {cost['wall_s'] / 60:.1f} min"


__all__ = ["PoolPriorSettings", "PoolPriorSolver", "layer_importance", "prior_weights"]
