"""What ``ilp`` and ``dp`` share: the cost of a cell, the noise rule, and the tie-break.

Cost
    ``objective`` picks the signal (``dppl``, ``1-cosine`` or ``kl``; see :mod:`signals.predict`);
    ``auto`` (default) is ``kl`` when the table carries it (version 2), else ``dppl``. KL is
    non-negative by construction and far less noisy: on SmolLM2 with 2 samples of 512+32 tokens,
    681 of 720 cells' ΔPPL intervals contain 0 against 93 of KL's, and the median relative SE is
    1.10 for ΔPPL against 0.26 for KL.
    No cell may look better than FullKV by chance, so the measured value becomes a cost by a
    **noise rule** (``noise``):

    * ``clip``: ``max(value, 0)``, FullKV's own cost;
    * ``interval``: also 0 for every cell whose ``confidence`` interval (value ± t·SE, Student t
      with the table's ``se_dof``) contains FullKV's value: a cell the calibration cannot tell from
      FullKV costs what FullKV costs;
    * ``upper``: ``max(value + t·SE, 0)``, the pessimistic end of that interval: a cell is chosen
      for being *confidently* cheap, so a noisy cell that looks better than FullKV costs more than
      a well-measured one that is slightly worse;
    * ``auto`` (default): ``upper`` when the table has standard errors (version 2), else ``clip``.

    Under every rule the noisy-negative ΔPPL cells that made the old objective report "−7.44,
    better than FullKV" cost at least 0, so the optimum is never below FullKV; ``clip`` and
    ``interval`` only stop rewarding them (they cost what FullKV costs), ``upper`` also stops
    trusting them (``tests/test_solvers_noise.py`` shows the three on a hand-made table).

Tie-break (``tie_break``)
    Costs of 0 tie, and a tie between a small and a large budget is exactly where the signals cannot
    tell. Among the assignments whose cost is within ``tie_tolerance`` (absolute, plus a 1e-9
    relative guard) of the optimum, ``spend`` (default) takes one that uses the **most** budget and
    ``save`` one that uses the least; among those, the cheapest. ``ilp`` does this with two more
    MILPs (maximize Σ b under a cost cap, then minimize cost at that Σ b); ``dp`` reads it off its
    table of "least cost at exactly this total". Both are exact, so they agree on the objective and
    on the budget used; what is left unused is reported in every result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from signals.predict import OBJECTIVES
from solvers.base import Problem, Settings, SolverError, cost_tensor, setting
from solvers.heads import target_context_setting

NOISE_CHOICES = ("auto", "clip", "interval", "upper")
HEAD_SIGNALS = ("answer", "prose", "sum")
TIE_BREAKS = ("spend", "save")


@dataclass(frozen=True)
class ExactSettings(Settings):
    objective: str = setting(
        "auto", "predicted degradation to minimize (auto: kl when the table has it, else dppl)", ("auto", *OBJECTIVES)
    )
    noise: str = setting(
        "auto",
        "measured value -> cost: clip at 0; 0 when its interval contains FullKV; upper end of the interval",
        NOISE_CHOICES,
    )
    confidence: float = setting(0.95, "interval level of noise=interval and noise=upper")
    tie_break: str = setting("spend", "among (near-)optimal assignments: spend the most budget, or save it", TIE_BREAKS)
    tie_tolerance: float = setting(
        0.0, "assignments within this much of the optimal cost count as ties (objective units)"
    )
    max_distinct_budgets: int | None = setting(None, "at most k distinct budget values per phase (memory pools)")
    granularity: str = setting(
        "layer",
        "layer: a (pattern, budget) cell per layer; head: keep-all or a (pattern, budget) head cell per (layer, "
        "KV head), from the table's head cells (collect --head-cells [--head-patterns])",
        ("layer", "head"),
    )
    head_patterns: str | None = setting(
        None,
        "granularity head: the cell patterns to choose among, comma separated (default: every pattern with head "
        "cells in the table: streaming cells and prefill cells of collect --head-patterns)",
    )
    head_signal: str = setting(
        "sum", "granularity head: the cells' KL to minimize (answer tokens, prose, or their sum)", HEAD_SIGNALS
    )
    target_context_len: int | None = target_context_setting()

    def check(self) -> None:
        if self.target_context_len is not None and self.target_context_len < 1:
            raise SolverError(f"target_context_len: must be >= 1, got {self.target_context_len}")
        if self.max_distinct_budgets is not None and self.max_distinct_budgets < 1:
            raise SolverError(f"max_distinct_budgets: must be >= 1, got {self.max_distinct_budgets}")
        if not 0 < self.confidence < 1:
            raise SolverError(f"confidence: must be in (0, 1), got {self.confidence:g}")
        if self.tie_tolerance < 0:
            raise SolverError(f"tie_tolerance: must be >= 0, got {self.tie_tolerance:g}")


def objective_of(settings: ExactSettings, problem: Problem) -> str:
    """The objective in force: ``auto`` resolved against the problem's table."""
    if settings.objective != "auto":
        return settings.objective
    return "kl" if "kl" in problem.require_table("exact").signals else "dppl"


def noise_rule(settings: ExactSettings, problem: Problem) -> str:
    """The noise rule in force: ``auto`` resolved against the problem's table."""
    if settings.noise != "auto":
        return settings.noise
    return "upper" if problem.require_table("exact").has_uncertainty else "clip"


def phase_costs(problem: Problem, phase: str, settings: ExactSettings) -> tuple[np.ndarray, list[str], tuple[int, ...]]:
    """``(cost (L, P, G) with inf for unusable cells, pattern names, grid)`` of one phase."""
    table = problem.require_table("exact")
    grid = problem.selection_grid()
    pidx = problem.pattern_indices()
    gidx = [table.budget_index(b) for b in grid]
    cost = cost_tensor(
        table, phase, objective_of(settings, problem), pidx, gidx, noise_rule(settings, problem), settings.confidence
    )
    return cost, [table.patterns[i] for i in pidx], grid


def tie_slack(optimum: float, tolerance: float) -> float:
    """How far above the optimum an assignment may cost and still tie."""
    return tolerance + 1e-9 * max(1.0, abs(optimum))


def describe(settings: ExactSettings, problem: Problem, objective: float, unused: dict[str, int]) -> str:
    """The solvers' one-line message."""
    spare = ", ".join(f"{p} {n}" for p, n in unused.items())
    return (
        f"optimal {objective_of(settings, problem)} (noise={noise_rule(settings, problem)}) = {objective:.6g}; "
        f"tie-break {settings.tie_break}; unused budget per phase of {problem.total}: {spare}"
    )


def cost_provenance(settings: ExactSettings, problem: Problem) -> dict:
    """What the strategy's provenance records about the cost the solver minimized."""
    return {
        "objective_cost": {
            "objective": objective_of(settings, problem),
            "noise": noise_rule(settings, problem),
            "confidence": settings.confidence,
            "tie_break": settings.tie_break,
            "tie_tolerance": settings.tie_tolerance,
        }
    }
