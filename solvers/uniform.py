"""``uniform``: one pattern, ``floor(B)`` tokens, in every layer (the uniform-X baseline).

Needs no signal table. The budget is capped at ``max_budget`` when the problem sets one.
"""

from __future__ import annotations

from dataclasses import dataclass

from polykv_search.patterns import PATTERNS
from solvers.base import Plan, Problem, Settings, Solver, SolverError, setting


@dataclass(frozen=True)
class UniformSettings(Settings):
    pattern: str = setting("snapkv", "pattern used in every layer")

    def check(self) -> None:
        if self.pattern not in PATTERNS:
            raise SolverError(f"pattern: unknown pattern {self.pattern!r}; known: {', '.join(PATTERNS)}")
        if self.pattern == "full":
            raise SolverError("pattern: 'full' has no budget; use Strategy.full() for FullKV")


class UniformSolver(Solver):
    name = "uniform"
    description = "uniform-X baseline: one pattern with budget floor(B) in every layer (no table needed)"
    needs_table = False
    Settings = UniformSettings

    def _solve(self, problem: Problem) -> Plan:
        b = problem.uniform_budget
        choice = (self.settings.pattern, b)
        return Plan(
            {phase: [choice] * problem.num_layers for phase in problem.phases},
            message=f"{self.settings.pattern} at {b} tokens in every layer",
        )
