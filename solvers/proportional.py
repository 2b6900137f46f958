"""``proportional``: the PolyKV paper's rule (arXiv 2606.15157; docs/design.md §6).

For every optimized phase φ and layer l, with the reference budget ``b_ref`` (default: the grid
value closest to B, ties to the smaller):

* **pattern** ``r_{l,φ}`` = the allowed pattern with the best preference signal at ``b_ref``:
  highest cosine (``preference="cosine"``), lowest ΔPPL (``"ppl"``) or lowest KL(FullKV ‖ cell)
  (``"kl"``); missing cells are skipped, ties go to the pattern listed first in the table.
* **budget** ``b_{l,φ} = b_min + (L·B − L·b_min) · s_l / Σ_k s_k`` with the sensitivity ``s``:
  attention entropy of (l, φ) (``sensitivity="entropy"``), or the worst case over the allowed
  patterns at ``b_ref`` of ΔPPL (``"ppl"``) or of KL (``"kl"``), raised to ``exponent`` (1 in the
  paper). Negative sensitivities (a ΔPPL below 0 by noise) count as 0; if every ``s_l`` is 0 the
  split is even. The KL settings need a table with the KL signal (version 2).

``L·B`` is taken as ``T = floor(L·B)``; integers by largest remainder (ties to the lower layer), so
``Σ_l b_l = T`` exactly. A layer above ``max_budget`` (it cannot use more, e.g. the context length)
is capped and its excess goes to the others in proportion to their ``s`` (see
:func:`~solvers.base.allocate`). Budgets need not be on the grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.base import Plan, Problem, Settings, Solver, SolverError, allocate, setting


@dataclass(frozen=True)
class ProportionalSettings(Settings):
    preference: str = setting(
        "cosine",
        "pattern per layer: highest cosine, lowest dPPL or lowest KL at the reference budget",
        ("cosine", "ppl", "kl"),
    )
    sensitivity: str = setting(
        "entropy", "budget share: attention entropy, or worst-case dPPL or KL over patterns", ("entropy", "ppl", "kl")
    )
    reference_budget: int | None = setting(
        None, "grid budget where signals are read (default: grid value closest to B)"
    )
    exponent: float = setting(1.0, "budget share is proportional to sensitivity**exponent (paper: 1)")

    def check(self) -> None:
        if self.exponent < 0:
            raise SolverError(f"exponent: must be >= 0, got {self.exponent:g}")


class ProportionalSolver(Solver):
    name = "proportional"
    description = "PolyKV paper rule: best pattern per layer, budgets b_min + (LB - L b_min) * s_l / sum(s)"
    needs_table = True
    Settings = ProportionalSettings
    settings: ProportionalSettings

    def _solve(self, problem: Problem) -> Plan:
        table = problem.require_table(self.name)
        s = self.settings
        if "kl" in (s.preference, s.sensitivity) and "kl" not in table.signals:
            raise SolverError(
                "signals: the table has no KL signal (version 1); recollect it or use preference/sensitivity ppl"
            )
        ref = problem.reference_budget(s.reference_budget)
        g = table.budget_index(ref)
        pidx = problem.pattern_indices()
        names = [table.patterns[i] for i in pidx]
        choices: dict[str, list[tuple[str, int]]] = {}
        info: dict[str, Any] = {"reference_budget": ref}
        for phase in problem.phases:
            f = table.phase_index(phase)
            read = {k: table.signal_array(k)[:, f][:, pidx, g] for k in ("cosine", "dppl", "kl")}  # (L, P) each
            signal = {"cosine": read["cosine"], "ppl": -read["dppl"], "kl": -read["kl"]}[s.preference]
            pref = np.where(np.isfinite(signal), signal, -np.inf)
            patterns = []
            for layer in range(problem.num_layers):
                row = pref[layer]
                if not np.isfinite(row).any():
                    raise SolverError(
                        f"signals: layer {layer} {phase} has no {s.preference} value at budget {ref} "
                        f"for patterns {names}"
                    )
                patterns.append(names[int(np.argmax(row))])  # first maximum = first listed pattern
            if s.sensitivity == "entropy":
                sens = table._entropy[:, f].copy()  # noqa: SLF001
                missing = [l for l in range(problem.num_layers) if not np.isfinite(sens[l])]
                if missing:
                    raise SolverError(f"signals: entropy missing for {phase} layers {missing}")
            else:
                values = read["dppl" if s.sensitivity == "ppl" else "kl"]
                sens = np.where(np.isfinite(values), values, -np.inf).max(axis=1)
                missing = [l for l in range(problem.num_layers) if not np.isfinite(sens[l])]
                if missing:
                    name = "dPPL" if s.sensitivity == "ppl" else "KL"
                    raise SolverError(f"signals: {name} at budget {ref} missing for {phase} layers {missing}")
            weights = np.maximum(sens, 0.0) ** s.exponent if s.exponent != 0 else np.ones_like(sens)
            budgets = allocate(
                problem.total, weights=weights, base=float(problem.b_min), lo=problem.b_min, hi=problem.max_budget
            )
            choices[phase] = [(p, int(b)) for p, b in zip(patterns, budgets)]
            info[phase] = {"sensitivity": sens.tolist()}
        return Plan(
            choices,
            message=f"preference={s.preference}, sensitivity={s.sensitivity} at reference budget {ref}",
            info=info,
        )
