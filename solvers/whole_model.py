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
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from polykv_search.data import samples_fingerprint
from polykv_search.models import ModelError, load_model, model_fingerprint
from polykv_search.progress import ProgressBar
from polykv_search.protocol import PROTOCOLS
from polykv_search.scoring.engine import MAX_BATCH_ENTRIES
from signals.journal import JournalError
from solvers import get_solver_class
from solvers.base import Plan, Problem, Settings, Solver, SolverError, SolveResult, setting
from solvers.guard import MAX_SAMPLES, guard_samples, uniform_candidates
from solvers.problem import layer_choice
from solvers.search_loop import local_search
from solvers.search_objective import DEFINITION, SearchJournal, WholeModelObjective
from solvers.search_space import PRIOR_MOVES, SearchSpace, check_budgets, layer_blocks
from solvers.settings import MAX_SEED
from strategies import PHASES, Strategy, StrategyError

#: Solvers that cannot be the start (they run the model themselves).
NOT_A_START = ("search", "optuna", "pool-prior")
#: The most strategies one search measures (each on every sample: 10,000 x 8 samples is days of CPU time).
MAX_EVALUATIONS = 10_000


@dataclass(frozen=True)
class MeasureSettings(Settings):
    """How a solver that measures whole strategies on the model draws its samples, journals and runs them
    (``search``, ``pool-prior``)."""

    samples: int = setting(
        8,
        f"calibration samples the strategies are measured on (drawn like the guard's; at most {MAX_SAMPLES:,})",
        most=MAX_SAMPLES,
    )
    sample_seed: int | None = setting(
        None, "seed of those samples (default: the table's calibration seed + 1)", most=MAX_SEED
    )
    mix: str | None = setting(
        None,
        "evidence samples among them, a count or a fraction (default: the table's share, or half when the table "
        "has none: prose alone cannot see a lost fact)",
    )
    protocol: str | None = setting(
        None,
        "protocol of those samples (default: the table's): where the query sits when the strategy is deployed",
        choices=PROTOCOLS,
    )
    level: float = setting(0.95, "confidence level of the acceptance intervals (Bonferroni over the candidates)")
    seed: int = setting(0, "seed of the bootstrap (and of the search's move order)", most=MAX_SEED)
    journal: str | None = setting(None, "journal of measured strategies (solve: OUT.journal; none: in memory)")
    fresh: bool = setting(False, "discard the journal and measure everything again")
    batched: bool = setting(
        True, "measure a round's strategies on each sample at once (the scoring engine); false: one at a time"
    )
    batch_entries: int = setting(
        16,
        f"batched: continuation rows run in one batch at most (memory cap; at most {MAX_BATCH_ENTRIES:,})",
        most=MAX_BATCH_ENTRIES,
    )
    model: str | None = setting(None, "model to run (default: the signal table's)")
    device: str | None = setting(None, "device of the model (default: the table's)")
    progress: bool = setting(True, "show a progress bar on stderr")

    def check(self) -> None:
        for name, least in (("samples", 2), ("batch_entries", 1)):
            if getattr(self, name) < least:
                raise SolverError(f"{name}: must be at least {least}, got {getattr(self, name)}")
        self.check_seeds("seed", "sample_seed")
        if not 0.5 <= self.level < 1.0:
            raise SolverError(f"level: must be in [0.5, 1), got {self.level}")


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


def measure_mix(mix: str | None, table) -> str | None:
    """``mix``, or when unset and the table was collected on prose alone, half evidence samples: the objective
    must see facts lost (the guard keeps the table's share)."""
    retrieval = table.provenance.get("retrieval") or {}
    return "0.5" if mix is None and not retrieval.get("evidence_samples") else mix


class WholeModelSolver(Solver):
    name = "search"
    description = (
        "whole-model local search from the calibrated solve and the best uniform, measured on calibration "
        "samples; a move is kept only when resolved better"
    )
    needs_table = True
    Settings = SearchSettings

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        loaded_model: tuple[Any, Any] | None = None,
        evaluator: Callable[[Sequence[Strategy]], Any] | None = None,
        kinds: Sequence[str] | None = None,
        **kwargs,
    ):
        super().__init__(settings, **kwargs)
        if evaluator is not None and (loaded_model is not None or not kinds):
            raise SolverError("evaluator= needs kinds= (one per sample) and no loaded_model=")
        self.loaded_model = loaded_model
        self.evaluator, self.kinds = evaluator, list(kinds or [])
        self.trace = None  # the last search (for inspection)

    def solve(self, problem: Problem) -> SolveResult:
        result = super().solve(problem)
        if self.trace is not None and result.strategy.digest() != self.trace.result.digest():
            raise SolverError("search: internal error, the written strategy is not the searched one")
        return result

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        begin = time.perf_counter()
        solved_name, solved = self._calibrated_start(problem)
        starts = [(solved_name, solved), *uniform_candidates(problem, solved)]
        step = max(1, round(s.step * problem.global_budget))
        with self._objective(problem) as (objective, kinds, described):
            trace = local_search(
                starts,
                lambda start: SearchSpace(
                    problem, start, blocks=s.blocks, step=step, patterns=problem.patterns, priors=s.prior_moves()
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

    @contextmanager
    def _objective(self, problem: Problem):
        """``(objective, sample kinds, samples description)``: the injected evaluator, or the model on calibration
        samples drawn like the guard's, journaled, with a progress bar."""
        if self.evaluator is not None:
            yield self.evaluator, self.kinds, {"evaluator": "injected"}
            return
        s = self.settings
        model, tokenizer = self._model(problem)
        samples, described = guard_samples(
            tokenizer,
            problem.table,
            s.samples,
            seed=s.sample_seed,
            mix=measure_mix(s.mix, problem.table),
            protocol=s.protocol,
        )
        described = {  # the journal's key: the samples' tokens and scored spans, not only how they were drawn
            **described,
            "fingerprint": samples_fingerprint(samples),
            "scored": [list(x.scored) if getattr(x, "scored", None) is not None else None for x in samples],
        }
        journal = self._journal(model, described)
        described = {**described, "journal": str(journal.path) if journal.path is not None else None}
        console = Console(stderr=True) if s.progress else None
        try:
            with ProgressBar(console, self.name, self._planned() * len(samples), unit="runs") as bar:
                objective = WholeModelObjective(
                    model,
                    samples,
                    journal,
                    on_run=lambda: bar.advance(1),
                    batched=s.batched,
                    batch_entries=s.batch_entries,
                )
                yield objective, objective.kinds, described
        finally:
            journal.close()

    # ------------------------------------------------------------------ parts
    def _planned(self) -> int:
        """Strategies the solve measures at most (the progress bar's total, per sample)."""
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

    def _model(self, problem: Problem):
        if self.loaded_model is not None:
            return self.loaded_model
        prov = problem.table.provenance
        args = prov.get("model_args") or {}
        name = self.settings.model or prov.get("model")
        if not name:
            raise SolverError("model: the table does not name its model; give --model")
        try:
            return load_model(
                name,
                device=self.settings.device or args.get("device", "cpu"),
                dtype=args.get("dtype", "float32"),
                attn_implementation=args.get("attn", "sdpa"),
            )
        except (ModelError, ValueError, OSError) as err:
            raise SolverError(f"model: cannot load {name!r}: {str(err).splitlines()[0]}") from None

    def _journal(self, model, described: dict[str, Any]) -> SearchJournal:
        key = {
            "model": str(getattr(model.config, "name_or_path", "")),
            "model_fingerprint": model_fingerprint(model),
            "samples": described,
            "definition": DEFINITION,
        }
        path = self.settings.journal
        path = None if path is None or path.lower() == "none" else path
        try:
            return SearchJournal.open(path, key, fresh=self.settings.fresh)
        except JournalError as err:
            raise SolverError(str(err)) from None


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


__all__ = ["MeasureSettings", "SearchSettings", "WholeModelSolver"]
