"""``pool-prior``: static priors over KVzip's model-wide pool, per layer or per KV head, chosen on calibration samples.

KVzip's pool (``kvzip[allocation=model]``) adapts per prompt: every layer's tokens are ranked together at the sum
of the layers' budgets. The signal table knows which layers (and, with head cells, which KV heads) hurt most when
they lose tokens. This solver lets that knowledge steer the pool without replacing it (issue 59, "static priors
over the dynamic pool"): every layer keeps the pool's pattern at ``floor(B)``, with a pool prior
(:class:`~polykv_search.patterns.kvzip.KVzip`'s ``weight``, ``floor`` or ``cap``; ``prior``) set per layer
(``granularity=layer``) or per KV head (``granularity=head``: one value per KV head, ``weight=2/0.5/1``) from each
cell's *importance* (:mod:`solvers.pool_prior_shape`: the table's cost of compressing that layer, or that KV
head, alone with the pool's own per-head pattern, mean over the grid budgets up to the reference budget, noise
rule ``clip``). One level of the prior gives every cell its value:

    ``weight`` at ``alpha``: ``w(alpha) = ((s + eps) / mean(s + eps)) ** alpha``, ``eps = smoothing * mean(s)``;
    ``floor`` at ``f``: ``min(b, floor(f * b * w(1)))``;  ``cap`` at ``c``: ``max(1, ceil(c * b * w(1)))``.

Weights are rounded to 3 significant digits (the spec written is the one measured). Without the pool's own cells
in the layer table, the worst pattern's cost is used (recorded in ``importance_from``); per KV head, the head
cells of the pool's pattern are required.

Choice of the level: the plain pool (level 0: weights 1, no floor, no cap) is the start. It and every level of
the grid (``alphas`` for weights, ``levels`` for floors and caps) are measured with the whole-model search's
objective (:mod:`solvers.search_objective`: KL(FullKV ‖ strategy) on each calibration sample's scored span, whole
model, both phases; samples drawn like the guard's from the table's calibration split, never evaluation data), and
a level replaces the plain pool only by the guard's rule (:func:`solvers.guard.decide`: its paired difference to
the plain pool, BCa stratified by sample kind, lies entirely below 0 at the Bonferroni level over the grid; among
those, the lowest mean KL). So the result is the plain pool or resolved better than it on the calibration
samples. Every value is journaled (``solve``: ``OUT.journal``): a killed solve rerun with the same command
measures nothing twice.

The default exponents stay at or below 1: a layer's importance can be ten times the mean (layer 23 of SmolLM2 in
``studies/kvzip/h19-signals.json.xz``), so ``alpha = 1`` already spans weights 0.11 to 11.2 there.

Cost: one strategy per level plus the plain pool (fewer when two levels give the same priors) on ``samples``
samples, each sample's FullKV reference once; batched, one call of the scoring engine per sample.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from polykv_search.patterns import canonical_spec, make_pattern, pattern_spec, spec_label
from solvers.base import Plan, Problem, SolverError, setting
from solvers.guard import decide
from solvers.measuring import MeasureSettings, MeasuringSolver
from solvers.pool_prior_shape import (
    DEFAULT_LEVELS,
    HEAD_SIGNALS,
    PRIORS,
    head_importance,
    layer_importance,
    prior_values,
    prior_weights,
)
from solvers.problem import layer_choice
from strategies import PHASES, Strategy


@dataclass(frozen=True)
class PoolPriorSettings(MeasureSettings):
    pattern: str = setting("kvzip[allocation=model]", "the pooled pattern every layer uses (allocation=model)")
    prior: str = setting("weight", "the prior set from the importance: weight, floor or cap", PRIORS)
    granularity: str = setting("layer", "one value per layer, or per KV head (from the head cells)", ("layer", "head"))
    alphas: str = setting(
        "auto", "weight: exponents tried, comma separated: w = (importance / mean)^alpha (auto: 0.25,0.5,1)"
    )
    levels: str = setting(
        "auto", "floor: shares f in (0, 1]; cap: multiples c >= 1 of b * w(1) (auto: 0.25,0.5,1 and 1,2,4)"
    )
    signal: str = setting("auto", "importance: the table's kl (auto, when it has it) or dppl", ("auto", "kl", "dppl"))
    head_signal: str = setting("sum", "granularity head: the cells' KL on answers, prose or their sum", HEAD_SIGNALS)
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
        """The levels of the prior other than 0 (``alphas`` for weights, ``levels`` else), in order, each once."""
        if self.prior == "weight" and self.levels != "auto":
            raise SolverError("levels: weights take their exponents from alphas; levels are for floor and cap")
        if self.prior != "weight" and self.alphas != "auto":
            raise SolverError(
                f"alphas: exponents of weights; a {self.prior} takes its levels from levels (its shape is w(1))"
            )
        name = "alphas" if self.prior == "weight" else "levels"
        text = getattr(self, name)
        text = DEFAULT_LEVELS[self.prior] if text == "auto" else text
        low, high = {"weight": (-8, 8), "floor": (0, 1), "cap": (1, 64)}[self.prior]
        out: list[float] = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            try:
                value = float(part)
            except ValueError:
                raise SolverError(f"{name}: {part!r} is not a number") from None
            if not np.isfinite(value) or not low <= value <= high or (self.prior == "floor" and value == 0):
                what = "(0, 1]" if self.prior == "floor" else f"[{low}, {high}]"
                raise SolverError(f"{name}: each must be a number in {what}, got {part!r}")
            if value != 0 and value not in out:
                out.append(value)
        if not out:
            raise SolverError(f"{name}: give at least one {_level_word(self.prior)} other than 0, got {text!r}")
        return out


class PoolPriorSolver(MeasuringSolver):
    name = "pool-prior"
    description = (
        "per-layer or per-head weights, floors or caps on KVzip's model-wide pool from the table's importance, "
        "the level chosen on calibration samples; kept only when resolved better than the plain pool"
    )
    needs_table = True
    Settings = PoolPriorSettings
    settings: PoolPriorSettings

    def _planned(self) -> int:
        return len(self.settings.grid()) + 1

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        begin = time.perf_counter()
        name, params = pattern_spec(s.pattern)
        pool = make_pattern(name, **params)
        if s.granularity == "head":
            importance, source = head_importance(problem, pool, s.head_signal, s.reference_budget)
        else:
            importance, source = layer_importance(problem, pool, s.signal, s.reference_budget)
        b = problem.uniform_budget
        if problem.num_layers * b > problem.total or b < problem.b_min:
            raise SolverError(f"infeasible: floor(B) = {b} in every layer breaks b_min={problem.b_min}")
        specs: dict[str, dict[str, list[str]]] = {}
        values: dict[str, dict[str, list]] = {}
        for level in [0.0, *s.grid()]:
            per_phase = {
                phase: prior_values(s.prior, v, level, s.smoothing, b).tolist() for phase, v in importance.items()
            }
            spec = {phase: [_spec(name, params, s.prior, x) for x in v] for phase, v in per_phase.items()}
            if spec not in specs.values():  # two levels with the same priors are measured once
                specs[_label(s.prior, level)] = spec
                values[_label(s.prior, level)] = per_phase
        names = list(specs)
        strategies = [_strategy(problem, specs[n], b) for n in names]
        if len(strategies) == 1:  # before the model is loaded
            word = _level_word(s.prior)
            raise SolverError(f"pool-prior: every {word} gives the plain pool (the importances are all equal)")
        with self._objective(problem) as (objective, kinds, described):
            measured = objective(strategies)
        g = decide(measured, names, kinds, level=s.level, seed=s.seed)
        chosen = g.chosen
        self.trace = _Chosen(strategies[names.index(chosen)])
        cost = objective.cost() if hasattr(objective, "cost") else {}
        cost["wall_s"] = round(time.perf_counter() - begin, 3)
        record = {
            **g.to_json(),
            "start": names[0],
            "prior": s.prior,
            "granularity": s.granularity,
            "importance": importance,
            "importance_from": source,
            s.prior + "s": values,
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
    """What :meth:`MeasuringSolver.solve` checks the written strategy against."""

    result: Strategy


def _spec(name: str, params: dict[str, Any], prior: str, value) -> str:
    """The pool's spec with ``prior`` = ``value`` (a list: one per KV head), canonical (defaults dropped)."""
    value = tuple(value) if isinstance(value, list) else value
    return canonical_spec(spec_label(name, {**params, prior: value}))


def _level_word(prior: str) -> str:
    return "exponent" if prior == "weight" else "level"


def _label(prior: str, level: float) -> str:
    return "plain-pool" if level == 0 else f"{'alpha' if prior == 'weight' else prior}={level:g}"


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
        line = f"the {start} kept (no level resolved better)"
    runs = ""
    if "strategy_runs" in cost:
        runs = f"; {cost['strategy_runs']} strategy runs, {cost['forward_calls']} model calls"
    return f"{line}, {len(g.names)} strategies measured{runs}, {cost['wall_s'] / 60:.1f} min"


__all__ = ["PoolPriorSettings", "PoolPriorSolver", "head_importance", "layer_importance", "prior_weights"]
