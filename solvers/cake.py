"""``cake``: CAKE's layer budgets, offline approximation (Qin et al., "CAKE: Cascading and Adaptive
KV cache Eviction with Layer Preferences", ICLR 2025, arXiv 2503.12491).

CAKE computes per layer a preference ``P_l = H_l^(1/τ1) · V_l^(1/τ2)`` from the attention entropy
``H`` (spatial dispersion) and the attention variance over queries ``V`` (temporal shift) of the
*current prompt*, and splits the total budget in proportion: ``b_l = P_l / Σ P · L·B``. CAKE does
this online, per prompt, with cascading eviction. This solver is the **offline approximation**: the
preference uses the calibration means stored in the signal table (``entropy``, ``variance`` per
layer and phase), once, for every prompt; provenance says so (``approximation``).

Budgets: ``clip(λ·P_l, b_min, max_budget)`` with λ set so that ``Σ = floor(L·B)``, then largest
remainder (:func:`~solvers.base.allocate`). The pattern is a setting (default ``snapkv``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polykv_search.patterns import PATTERNS
from solvers.base import Plan, Problem, Settings, Solver, SolverError, allocate, setting

APPROXIMATION = "offline: CAKE preference from calibration-mean entropy and variance, not per prompt"


@dataclass(frozen=True)
class CakeSettings(Settings):
    pattern: str = setting("snapkv", "pattern used in every layer")
    tau1: float = setting(1.0, "temperature of the entropy term: preference uses entropy**(1/tau1)")
    tau2: float = setting(1.0, "temperature of the variance term: preference uses variance**(1/tau2)")

    def check(self) -> None:
        if self.pattern not in PATTERNS or self.pattern == "full":
            raise SolverError(f"pattern: {self.pattern!r} is not a budgeted pattern; known: {', '.join(PATTERNS)}")
        if self.tau1 <= 0 or self.tau2 <= 0:
            raise SolverError(f"tau1/tau2: must be > 0, got {self.tau1:g}/{self.tau2:g}")


class CakeSolver(Solver):
    name = "cake"
    description = "CAKE baseline (offline approximation): budget proportional to entropy^(1/t1) * variance^(1/t2)"
    needs_table = True
    Settings = CakeSettings
    settings: CakeSettings

    def _solve(self, problem: Problem) -> Plan:
        table = problem.require_table(self.name)
        s = self.settings
        L = problem.num_layers
        choices, info = {}, {}
        for phase in problem.phases:
            f = table.phase_index(phase)
            H = table._entropy[:, f]  # noqa: SLF001
            V = table._variance[:, f]  # noqa: SLF001
            bad = [l for l in range(L) if not (np.isfinite(H[l]) and np.isfinite(V[l]))]
            if bad:
                raise SolverError(f"signals: entropy/variance missing for {phase} layers {bad}")
            pref = np.maximum(H, 0.0) ** (1.0 / s.tau1) * np.maximum(V, 0.0) ** (1.0 / s.tau2)
            budgets = allocate(problem.total, weights=pref, base=0.0, lo=problem.b_min, hi=problem.max_budget)
            choices[phase] = [(s.pattern, int(b)) for b in budgets]
            info[phase] = {"preference": pref.tolist()}
        return Plan(
            choices,
            message=f"tau1={s.tau1:g}, tau2={s.tau2:g} ({APPROXIMATION})",
            info=info,
            provenance={"approximation": APPROXIMATION},
        )
