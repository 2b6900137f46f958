"""What ``pool-prior`` reads and builds: each layer's (or KV head's) importance, and the prior a level gives it.

Importance (clipped: a cell never counts below FullKV), the mean over the grid budgets up to the reference one:

- per layer (:func:`layer_importance`): the layer table's cost of compressing layer ``l`` alone with the pool's own
  per-head pattern (its ``alone()`` variant); without such cells, the worst pattern's;
- per KV head (:func:`head_importance`): the head-level table's prefill cells of that pattern
  (``collect --head-cells --head-patterns kvzip[allocation=model]``; :mod:`solvers.heads`), KL when only head
  ``(l, h)`` keeps its own top ``b`` (every other head keeps everything), on the answer tokens, on prose, or their
  sum (``head_signal``, as ``ilp --granularity head``).

The priors (:func:`prior_values`), from ``w(alpha) = ((s + eps) / mean(s + eps)) ** alpha``, ``eps = smoothing *
mean(s)``, the mean over every cell (layer or (layer, KV head)) of a phase, at the pool's per-head budget ``b``:

- ``weight`` at level ``alpha``: ``w(alpha)`` (3 significant digits);
- ``floor`` at level ``f`` in (0, 1]: ``min(b, floor(f * b * w(1)))``: every cell keeps at least a share of its
  budget in proportion to its importance, the floors together at most the share ``f`` of the pool;
- ``cap`` at level ``c`` >= 1: ``max(1, ceil(c * b * w(1)))`` prompt tokens at most: a cell of low importance cannot
  take the pool's tokens beyond ``c`` times its share, and the caps together leave room for the whole pool.

Level 0 (no prior) is the plain pool: weights 1, no floor, no cap.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from polykv_search.patterns import make_pattern, pattern_spec
from signals.predict import cell_costs
from signals.table import SignalTableError
from solvers.base import Problem, SolverError
from solvers.heads import CELLS_OPTION, head_cell_sets
from strategies.pattern_spec import short_label, spec_label

PRIORS = ("weight", "floor", "cap")
#: The default grid of levels of each prior (``weight``: the exponents ``alphas``).
DEFAULT_LEVELS = {"weight": "0.25,0.5,1", "floor": "0.25,0.5,1", "cap": "1,2,4"}
HEAD_SIGNALS = ("sum", "answer", "prose")


def alone(spec: str):
    """The per-head variant of a pattern spec (None when it is not one)."""
    try:
        name, params = pattern_spec(spec)
        return make_pattern(name, **params).alone()
    except (ValueError, TypeError, KeyError):
        return None


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
    own = [i for i, p in enumerate(table.patterns) if alone(p) == pool.alone()]
    out = {}
    for phase in problem.phases:
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


def head_importance(problem: Problem, pool, signal: str, reference: int | None) -> tuple[dict[str, list], str]:
    """Per optimized phase, each (layer, KV head)'s importance ``[L][H]`` from the head cells of the pool's own
    per-head pattern (module docstring; the same in every phase: the cells compress the prompt), and its source."""
    sets = [c for c in head_cell_sets(problem.table) if alone(_label(c)) == pool.alone()]
    if not sets:
        raise SolverError(
            f"granularity head: the signal table has no head cells of {_label_of(pool)}; collect them with "
            f"`polykv-search collect {CELLS_OPTION} --head-patterns {_label_of(pool)} ...`"
        )
    cells = sets[0]
    grid = list(cells.budgets)
    if reference is not None and reference not in grid:
        raise SolverError(f"reference_budget: {reference} is not on the head cells' grid {grid}")
    ref = reference if reference is not None else min(grid, key=lambda b: (abs(b - problem.global_budget), b))
    keys = ["kl_answer", "kl_prose"] if signal == "sum" else [f"kl_{signal}"]
    used = [j for j, b in enumerate(grid) if b <= ref]
    values = np.maximum(sum(cells.mean[k] for k in keys), 0.0)[:, :, used].mean(axis=2)  # (L, H)
    if not np.isfinite(values).all():
        bad = sorted({int(x) for x in np.argwhere(~np.isfinite(values))[:, 0]})
        raise SolverError(f"signals: head cells of {_label(cells)} unknown up to budget {ref} in layers {bad}")
    rows = values.tolist()
    source = f"head cells {_label(cells)}, {'+'.join(keys)}, mean over budgets {[grid[j] for j in used]} (clip)"
    return {phase: rows for phase in problem.phases}, source


def _label(cells) -> str:
    return spec_label(cells.pattern, dict(cells.params))


def _label_of(pool) -> str:
    return short_label(pool.name, pool.pool_identity().params())


def prior_weights(importance, alpha: float, smoothing: float) -> list[float]:
    """``w_l = ((s_l + eps) / mean(s + eps)) ** alpha`` with ``eps = smoothing * mean(s)``, 3 significant digits
    (all 1 when every importance is 0)."""
    s = np.asarray(importance, dtype=np.float64)
    x = s + smoothing * s.mean()
    if not x.mean() > 0:
        return [1.0] * len(s)
    return [float(f"{w:.3g}") for w in (x / x.mean()) ** alpha]


def prior_values(kind: str, importance, level: float, smoothing: float, budget: int) -> np.ndarray:
    """The prior ``kind`` at ``level`` for every cell of ``importance`` (``[L]`` or ``[L, H]``, one phase), shaped
    like it (module docstring); level 0: the plain pool's value."""
    shape = np.shape(importance)
    flat = np.asarray(importance, dtype=np.float64).reshape(-1)
    if level == 0:
        return np.full(shape, 1.0 if kind == "weight" else 0, dtype=object)
    if kind == "weight":
        return np.asarray(prior_weights(flat, level, smoothing), dtype=object).reshape(shape)
    w = np.asarray(prior_weights(flat, 1.0, smoothing))
    if kind == "floor":
        values = [min(budget, math.floor(level * budget * x)) for x in w]
    else:
        values = [max(1, math.ceil(level * budget * x)) for x in w]
    return np.asarray(values, dtype=object).reshape(shape)


__all__ = [
    "DEFAULT_LEVELS",
    "HEAD_SIGNALS",
    "PRIORS",
    "alone",
    "head_importance",
    "layer_importance",
    "prior_values",
    "prior_weights",
]
