"""``pyramid``: PyramidKV's linear per-layer schedule (Cai et al., arXiv 2406.02069).

The PyramidKV code (``PyramidKVCluster.update_kv``) schedules the budget *outside* the protected
observation window ``w``: with ``m = B − w`` the top layer gets ``m/β`` and the bottom layer
``2m − m/β``, layers in between on a straight line, so the mean stays ``m``; each layer then adds
the window back. Here, with L layers and layer ``l = 0..L−1`` (bottom to top)::

    top    = (B − w) / β
    bottom = 2(B − w) − top
    t_l    = w + bottom − (bottom − top) · l / (L − 1)        (t_0 = B when L = 1)

Rounding: the reference code floors ``m/β`` and the step ``(bottom − top) // (L − 1)``, which makes
the sum *exceed* ``L·B`` by up to ``(L−1)·L/2`` tokens. We keep the real-valued line and round it
with :func:`~solvers.base.allocate` (common shift, largest remainder), so ``Σ b_l = floor(L·B)``
exactly, every ``b_l >= b_min`` (layers pushed up to ``b_min`` are paid for by the others) and
``b_l <= max_budget`` (the reference code's clamp at the prompt length plays the same role).

``w`` defaults to the pattern's ``window`` parameter (8 for ``pyramidkv``, 32 for ``snapkv``, 0 for
patterns without one). Needs no signal table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polykv_search.patterns import PATTERNS, get_pattern_class
from solvers.base import Plan, Problem, Settings, Solver, SolverError, allocate, setting


@dataclass(frozen=True)
class PyramidSettings(Settings):
    pattern: str = setting("pyramidkv", "pattern used in every layer")
    beta: float = setting(20.0, "PyramidKV's beta: top layer gets (B - window)/beta (larger = steeper)")
    window: int | None = setting(None, "tokens outside the schedule (default: the pattern's window parameter)")

    def check(self) -> None:
        if self.pattern not in PATTERNS or self.pattern == "full":
            raise SolverError(f"pattern: {self.pattern!r} is not a budgeted pattern; known: {', '.join(PATTERNS)}")
        if self.beta < 1:
            raise SolverError(f"beta: must be >= 1 (1 = uniform), got {self.beta:g}")
        if self.window is not None and self.window < 0:
            raise SolverError(f"window: must be >= 0, got {self.window}")


def pyramid_targets(num_layers: int, budget: float, beta: float, window: int) -> np.ndarray:
    """The real-valued PyramidKV line (mean ``budget``), bottom layer first."""
    m = budget - window
    if num_layers == 1:
        return np.array([float(budget)])
    top = m / beta
    bottom = 2.0 * m - top
    return window + bottom - (bottom - top) * np.arange(num_layers) / (num_layers - 1)


class PyramidSolver(Solver):
    name = "pyramid"
    description = "PyramidKV baseline: budgets fall linearly from bottom to top layer (beta=20), mean B"
    needs_table = False
    Settings = PyramidSettings
    settings: PyramidSettings

    def window(self) -> int:
        if self.settings.window is not None:
            return self.settings.window
        return int(getattr(get_pattern_class(self.settings.pattern)(), "window", 0) or 0)

    def _solve(self, problem: Problem) -> Plan:
        w = self.window()
        B = problem.global_budget
        if B - w <= 0:
            raise SolverError(f"pyramid: B={B:g} must exceed the window {w} (set --window lower)")
        targets = pyramid_targets(problem.num_layers, B, self.settings.beta, w)
        budgets = allocate(
            problem.total, base=targets, weights=np.ones(problem.num_layers), lo=problem.b_min, hi=problem.max_budget
        )
        chosen = [(self.settings.pattern, int(b)) for b in budgets]
        return Plan(
            {phase: list(chosen) for phase in problem.phases},
            message=f"linear schedule {int(budgets[0])} (bottom) -> {int(budgets[-1])} (top), window {w}",
            info={"targets": targets.tolist(), "window": w},
        )
