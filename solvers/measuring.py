"""The base of the solvers that measure whole strategies on the model (``search``: :mod:`solvers.whole_model`,
``pool-prior``: :mod:`solvers.pool_prior`): their settings of the samples, journal and model, and the solver
that loads the model, draws calibration samples like the guard's, journals every value and runs the objective.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from rich.console import Console

from polykv_search.data import samples_fingerprint
from polykv_search.models import ModelError, load_model, model_fingerprint
from polykv_search.progress import ProgressBar
from polykv_search.protocol import PROTOCOLS
from polykv_search.scoring.engine import MAX_BATCH_ENTRIES
from signals.journal import JournalError
from solvers.base import Problem, Settings, Solver, SolverError, SolveResult, setting
from solvers.guard import MAX_SAMPLES, guard_samples
from solvers.search_objective import DEFINITION, SearchJournal, WholeModelObjective
from solvers.settings import MAX_SEED
from strategies import Strategy


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


def measure_mix(mix: str | None, table) -> str | None:
    """``mix``, or when unset and the table was collected on prose alone, half evidence samples: the objective
    must see facts lost (the guard keeps the table's share)."""
    retrieval = table.provenance.get("retrieval") or {}
    return "0.5" if mix is None and not retrieval.get("evidence_samples") else mix


class _Traced(Protocol):
    """What :meth:`MeasuringSolver.solve` checks the written strategy against (the search's trace)."""

    @property
    def result(self) -> Strategy: ...


class MeasuringSolver(Solver):
    """Base of the solvers that measure whole strategies on the model (``search``, ``pool-prior``): the model,
    the calibration samples and the journal; a subclass plans what to measure (``_solve``, ``_planned``)."""

    Settings: ClassVar[type[MeasureSettings]] = MeasureSettings
    settings: MeasureSettings

    def __init__(
        self,
        settings: MeasureSettings | None = None,
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
        self.trace: _Traced | None = None  # the last search (for inspection)

    def solve(self, problem: Problem) -> SolveResult:
        result = super().solve(problem)
        if self.trace is not None and result.strategy.digest() != self.trace.result.digest():
            raise SolverError("search: internal error, the written strategy is not the searched one")
        return result

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
    @abstractmethod
    def _planned(self) -> int:
        """Strategies the solve measures at most (the progress bar's total, per sample)."""

    def _model(self, problem: Problem):
        if self.loaded_model is not None:
            return self.loaded_model
        prov = problem.require_table(self.name).provenance
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


__all__ = ["MeasureSettings", "MeasuringSolver", "measure_mix"]
