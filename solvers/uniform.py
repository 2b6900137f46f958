"""``uniform``: one pattern, ``floor(B)`` tokens, in every layer (the uniform-X baseline).

Needs no signal table. The budget is capped at ``max_budget`` when the problem sets one.
"""

from __future__ import annotations

from dataclasses import dataclass

from polykv_search.patterns import pattern_spec
from solvers.base import Plan, Problem, Settings, Solver, SolverError, setting


@dataclass(frozen=True)
class UniformSettings(Settings):
    pattern: str = setting("snapkv", "pattern used in every layer; a spec with parameters, kvzip[allocation=model]")

    def check(self) -> None:
        try:
            name = pattern_spec(self.pattern)[0]
        except ValueError as err:
            raise SolverError(f"pattern: {err}") from None
        if name == "full":
            raise SolverError("pattern: 'full' has no budget; use Strategy.full() for FullKV")


class UniformSolver(Solver):
    name = "uniform"
    description = "uniform-X baseline: one pattern with budget floor(B) in every layer (no table needed)"
    needs_table = False
    Settings = UniformSettings
    settings: UniformSettings

    def _solve(self, problem: Problem) -> Plan:
        b = problem.uniform_budget
        choice = (self.settings.pattern, b)
        return Plan(
            {phase: [choice] * problem.num_layers for phase in problem.phases},
            message=f"{self.settings.pattern} at {b} tokens in every layer",
        )
