"""``search``: a whole-model search that never returns a strategy resolved worse than its start.

A table-driven solve adds up cells that each compress one layer (or head) alone; at tight budgets the model
fails as a whole and the sum misleads (issue 59: the head-level ilp resolved below uniform kvzip
``allocation=model``, a candidate it was offered). This solver measures whole strategies instead:

1. **Starts**: the calibrated solve (``start``: a solver run on the same problem, e.g. ``ilp`` with
   ``start_settings="granularity=head"``, or a strategy file) and every uniform of the allowed patterns
   (:func:`solvers.guard.uniform_candidates`, as the guard builds them) are measured; the lowest mean KL is
   the start.
2. **Moves** (:mod:`solvers.search_space`): budget moved between blocks of layers (and the heads inside
   them, for head-level strategies), unused budget spent, patterns swapped per block, and with ``priors`` the
   weight, floor or cap of a block's slots in a model-wide pool (KVzip's) doubled / halved or moved by ``step``;
   feasible by construction (``Σ_l b_l <= floor(L·B)``, ``b_l >= b_min``), checked on every strategy built.
3. **Acceptance** (:mod:`solvers.search_loop`): a move is kept only when its per-sample KL is *resolved*
   below the current strategy's (the guard's rule, :func:`solvers.guard.decide`: paired BCa interval,
   stratified by prose / evidence samples, Bonferroni over the round's candidates), and the result is checked
   against the start at the end. The result is the start or a resolved improvement over it.

The objective (:mod:`solvers.search_objective`) is the guard's: KL(FullKV ‖ strategy) on each calibration
sample's scored span (evidence answers, prose continuations), the whole model in both phases, on samples
drawn like the guard's from the table's calibration split (``sample_seed``: the table's + 1 by default), never
evaluation data. Every value is journaled (``journal``; ``solve`` defaults it to ``OUT.journal``) so a killed
search resumes without running any strategy twice, and retraces the same path. The strategy's provenance
``search`` states the starts, every accepted move with its interval, the model runs and the wall time.

Tests inject ``loaded_model=(model, tokenizer)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solvers import get_solver_class
from solvers.base import Plan, Problem, SolverError, setting
from solvers.guard import uniform_candidates
from solvers.measuring import MeasureSettings, MeasuringSolver, measure_mix
from solvers.problem import layer_choice
from solvers.search_loop import local_search
from solvers.search_space import PRIOR_MOVES, SearchSpace, check_budgets, layer_blocks
from strategies import PHASES, Strategy, StrategyError

#: Solvers that cannot be the start (they run the model themselves).
NOT_A_START = ("search", "optuna", "pool-prior")
#: The most strategies one search measures (each on every sample: 10,000 x 8 samples is days of CPU time).
MAX_EVALUATIONS = 10_000


@dataclass(frozen=True)
class SearchSettings(MeasureSettings):
    start: str = setting(
        "ilp", "the calibrated solve to start from: a solver name (run on the same problem) or a strategy JSON file"
    )
    start_settings: str = setting("", "settings of the start solver, KEY=VALUE;KEY=VALUE (e.g. granularity=head)")
    blocks: int = setting(6, "contiguous groups of layers the moves act on (EvolKV-style; L: every layer alone)")
    step: float = setting(0.25, "tokens a budget move takes from each slot of a block, as a share of B (at least 1)")
    neighbors: int = setting(
        4,
        f"moves measured per round; the best resolved one is accepted (at most {MAX_EVALUATIONS:,}, as "
        "max_evaluations: a round measures no more)",
        most=MAX_EVALUATIONS,
    )
    max_moves: int = setting(
        10,
        f"stop after this many accepted moves (at most {MAX_EVALUATIONS:,}, as max_evaluations: each move is measured)",
        most=MAX_EVALUATIONS,
    )
    max_evaluations: int = setting(
        40,
        f"stop after this many strategies measured (starts included; at most {MAX_EVALUATIONS:,})",
        most=MAX_EVALUATIONS,
    )
    priors: str = setting(
        "none",
        "pool priors the moves may change too, in model-wide pools: none, or any of weight, floor, cap comma separated",
    )

    def check(self) -> None:
        super().check()
        for name, least in (("blocks", 1), ("neighbors", 1), ("max_evaluations", 1)):
            if getattr(self, name) < least:
                raise SolverError(f"{name}: must be at least {least}, got {getattr(self, name)}")
        if self.max_moves < 0:
            raise SolverError(f"max_moves: must be >= 0, got {self.max_moves}")
        if not 0.0 < self.step <= 1.0:
            raise SolverError(f"step: a share of B in (0, 1], got {self.step}")
        if self.start in NOT_A_START:
            raise SolverError(f"start: {self.start!r} cannot be the start (it runs the model itself)")
        _start_settings(self.start_settings)
        self.prior_moves()

    def prior_moves(self) -> tuple[str, ...]:
        """The pool priors of ``priors`` (empty for none)."""
        given = tuple(p.strip() for p in self.priors.split(",") if p.strip() and p.strip() != "none")
        if set(given) - set(PRIOR_MOVES) or len(set(given)) != len(given):
            raise SolverError(f"priors: none, or any of {', '.join(PRIOR_MOVES)} comma separated, got {self.priors!r}")
        return given


class WholeModelSolver(MeasuringSolver):
    name = "search"
    description = (
        "whole-model local search from the calibrated solve and the best uniform, measured on calibration "
        "samples; a move is kept only when resolved better"
    )
    needs_table = True
    Settings = SearchSettings
    settings: SearchSettings

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        begin = time.perf_counter()
        solved_name, solved = self._calibrated_start(problem)
        starts = [(solved_name, solved), *uniform_candidates(problem, solved)]
        step = max(1, round(s.step * problem.global_budget))
        patterns = problem.allowed_patterns(self.name)
        with self._objective(problem) as (objective, kinds, described):
            trace = local_search(
                starts,
                lambda start: SearchSpace(
                    problem,
                    start,
                    blocks=s.blocks,
                    step=step,
                    patterns=patterns,
                    priors=s.prior_moves(),
                ),
                objective,
                kinds,
                neighbors=s.neighbors,
                max_moves=s.max_moves,
                max_evaluations=s.max_evaluations,
                level=s.level,
                seed=s.seed,
                check=lambda strategy: check_budgets(strategy, problem),
            )
        self.trace = trace
        result = trace.result
        check_budgets(result, problem)
        cost = objective.cost() if hasattr(objective, "cost") else {}
        cost["wall_s"] = round(time.perf_counter() - begin, 3)
        record = {
            **trace.to_json(),
            "samples": described,
            "cost": cost,
            "step_tokens": step,
            "blocks": [[r.start, r.stop - 1] for r in layer_blocks(problem.num_layers, s.blocks)],
            "settings": s.to_json(),
        }
        return Plan(
            {phase: list(result.phase(phase)) for phase in problem.phases},
            objective=float(trace.values.mean()),
            message=_message(trace, cost),
            info={"search": record},
            provenance={"search": record},
            context_len=result.context_len,
            num_kv_heads=result.num_kv_heads,
            follows=dict(dict(starts)[trace.start].provenance.get("phases_following") or {}),
        )

    def _planned(self) -> int:
        return self.settings.max_evaluations

    def _calibrated_start(self, problem: Problem) -> tuple[str, Strategy]:
        s = self.settings
        path = Path(s.start)
        if s.start.endswith(".json") or path.exists():
            try:
                strategy = Strategy.load(path)
            except StrategyError as err:
                raise SolverError(f"start: {str(err).splitlines()[0]}") from None
            if strategy.num_layers != problem.num_layers or strategy.global_budget != problem.global_budget:
                raise SolverError(
                    f"start: {path} has {strategy.num_layers} layers at B={strategy.global_budget}, "
                    f"the problem {problem.num_layers} at B={problem.global_budget:g}"
                )
            if strategy.b_min != problem.b_min:  # else the strategy written would not be the one measured
                raise SolverError(
                    f"start: {path} has b_min={strategy.b_min}, the problem b_min={problem.b_min}; give --b-min "
                    f"{strategy.b_min}"
                )
            check_budgets(strategy, problem)
            _check_other_phases(path, strategy, problem)
            return f"start-{path.stem}", strategy
        cls = get_solver_class(s.start)
        if cls.name in NOT_A_START:
            raise SolverError(f"start: {s.start!r} cannot be the start (it runs the model itself)")
        settings = cls.Settings.from_strings(_start_settings(s.start_settings))
        return cls.name, cls(settings).solve(problem).strategy


def _start_settings(text: str) -> dict[str, str]:
    out = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise SolverError(f"start_settings: {part!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _check_other_phases(path: Path, strategy: Strategy, problem: Problem) -> None:
    """A start file's phases that are not optimized must be what the solve gives them (followed, or the
    uniform default), so that the written strategy is the one measured."""
    follows = dict(strategy.provenance.get("phases_following") or {})
    default = layer_choice(problem.default_pattern, problem.uniform_budget)
    for phase in PHASES:
        if phase in problem.phases:
            continue
        expected = strategy.phase(follows[phase]) if phase in follows else [default] * problem.num_layers
        if list(strategy.phase(phase)) != list(expected):
            raise SolverError(
                f"start: the {phase} phase of {path} is neither optimized (--phases) nor the solve's rule for it "
                f"({'a copy of ' + follows[phase] if phase in follows else problem.default_pattern + ' at floor(B)'})"
            )


def _message(trace, cost: dict[str, Any]) -> str:
    start = trace.starts[trace.start]
    kept = f"{trace.kept_steps} of {len(trace.steps)} accepted moves kept" if trace.steps else "no move accepted"
    line = f"started from {trace.start} (KL {start.estimate:.4g}), {kept}, {trace.evaluated} strategies measured"
    if trace.final is not None:
        f = trace.final
        line += f"; KL − start {f.estimate:+.4g} [{f.low:+.4g}, {f.high:+.4g}]"
    runs = ""
    if "strategy_runs" in cost:
        batched = f" in {cost['batched_calls']} batched calls" if cost.get("batched_calls") else ""
        runs = f"{cost['strategy_runs']} strategy runs{batched}, {cost['forward_calls']} model calls, "
    return f"{line}; {runs}{cost['wall_s'] / 60:.1f} min"


__all__ = ["MeasureSettings", "SearchSettings", "WholeModelSolver", "measure_mix"]
