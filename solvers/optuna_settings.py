"""Settings of the ``optuna`` solver and the constants of its search space."""

from __future__ import annotations

import re
from dataclasses import dataclass

from polykv_search.models import MAX_CONTEXT_LEN
from solvers.base import OBJECTIVES, Settings, SolverError, setting
from solvers.settings import MAX_SEED

FAMILIES_RULE = ("rule", "ilp", "uniform")
FAMILIES_LAYERS = ("per-layer", "ilp", "uniform")
#: The ilp family's objectives: the ilp solver's own (signals.predict).
ILP_OBJECTIVES = OBJECTIVES
#: Signals the rule ranks patterns by, the ilp anchor minimizes and uniform-best is chosen by.
DEGRADATIONS = ("auto", "dppl", "kl")
GAMMA_MAX = 3.0
FLOOR_SHARE_MAX = 0.9
#: The proportional anchor's rule parameters.
#: A study stops after MAX_TRIALS_FACTOR * trials finished trials even if repeats kept it short of
#: ``trials`` scored strategies.
MAX_TRIALS_FACTOR = 4
PROPORTIONAL_POINT = {"alpha": 1.0, "beta": 1.0, "gamma": 1.0, "floor_share": 0.0}
#: The most trials a study scores (each runs the model on every calibration sample) and calibration samples per
#: task (generated before the first trial, as ``score --samples``).
MAX_TRIALS = 10_000
MAX_SAMPLES = 10_000
#: The most trial threads: each holds its own copy of the model (64 float32 copies of SmolLM2-135M are 35 GB).
MAX_JOBS = 64


@dataclass(frozen=True)
class OptunaSettings(Settings):
    trials: int = setting(
        40,
        f"strategies the study should score (anchors and earlier runs count; repeats are free; at most {MAX_TRIALS:,})",
        most=MAX_TRIALS,
    )
    storage: str | None = setting(
        None, "optuna storage: journal file path, 'memory', or an RDB URL (default: <cache>/optuna/<study>.journal)"
    )
    jobs: int = setting(
        1,
        f"trials run in parallel threads (n_jobs); each thread uses its own model copy (at most {MAX_JOBS})",
        most=MAX_JOBS,
    )
    study_name: str | None = setting(
        None, "study name (default: a hash of the problem and settings, so a rerun resumes)"
    )
    seed: int = setting(0, "sampler seed and calibration sample seed", most=MAX_SEED)
    objectives: str = setting(
        "quality", "objectives: quality, or quality,memory for a Pareto front", ("quality", "quality,memory")
    )
    space: str = setting(
        "rule", "search space: allocation-rule parameters, or per-layer patterns (ablation)", ("rule", "per-layer")
    )
    model: str | None = setting(None, "model that scores trials (default: the signal table's model)")
    device: str = setting("cpu", "device of the scoring model")
    dtype: str = setting("float32", "dtype of the scoring model")
    samples: int = setting(8, f"calibration samples per task (at most {MAX_SAMPLES:,})", most=MAX_SAMPLES)
    context_len: int = setting(
        1024,
        f"prompt length in tokens of the calibration samples (at most the model's window and {MAX_CONTEXT_LEN:,})",
        most=MAX_CONTEXT_LEN,
    )
    corpus: str = setting("austen", "corpus spec; its calibration split is used")
    tasks: str = setting("broad/continuation", "tasks scored per trial, comma separated (suite or task names)")
    metric: str = setting(
        "score", "quality: mean task score, or -mean log perplexity of teacher-forced tasks", ("score", "log-ppl")
    )
    startup_trials: int = setting(
        10, f"random trials before TPE models the space (anchors count; at most {MAX_TRIALS:,})", most=MAX_TRIALS
    )
    mo_sampler: str = setting("tpe", "sampler for quality,memory: multi-objective TPE or NSGA-II", ("tpe", "nsga2"))
    population: int = setting(
        16, f"NSGA-II population size (at most {MAX_TRIALS:,}: a larger one never breeds)", most=MAX_TRIALS
    )
    min_budget_share: float = setting(0.25, "quality,memory: the smallest budget tried, as a share of B")
    degradation: str = setting(
        "auto",
        "signal of the rule's degradation rank and worst-case sensitivity, the ilp anchor and uniform-best "
        "(auto: kl if the table has it)",
        DEGRADATIONS,
    )
    verbose: bool = setting(False, "show optuna's per-trial log")

    def check(self) -> None:
        for name, low in (
            ("trials", 1),
            ("jobs", 1),
            ("samples", 1),
            ("context_len", 8),
            ("startup_trials", 0),
            ("population", 2),
        ):
            value = getattr(self, name)
            if value < low:
                raise SolverError(f"{name}: must be >= {low}, got {value}")
        self.check_seeds("seed")
        if not 0 < self.min_budget_share <= 1:
            raise SolverError(f"min_budget_share: must be in (0, 1], got {self.min_budget_share:g}")
        if self.storage is not None and not self.storage.strip():
            raise SolverError("storage: empty; give a journal file path, 'memory' or an RDB URL")
        if self.study_name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.study_name):
            raise SolverError(f"study_name: use letters, digits, '.', '_' and '-' only, got {self.study_name!r}")
        if not [t for t in self.tasks.split(",") if t.strip()]:
            raise SolverError("tasks: no task given")
        if self.model is not None and not self.model.strip():
            raise SolverError("model: empty")

    @property
    def two_objectives(self) -> bool:
        return self.objectives == "quality,memory"
