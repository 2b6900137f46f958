"""The comparison's value model: rows (one strategy or baseline at one budget), references, the whole."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from polykv_search.compare.reading import TaskSamples
from polykv_search.stats import Gap, Interval

COMPARISON_SCHEMA = "polykv-comparison"
#: 2: rows and references carry bootstrap intervals, differences to the best uniform, KL fidelity
COMPARISON_VERSION = 2
MIB = 2**20


@dataclass
class Row:
    """One strategy or baseline at one budget, merged over the files it appears in.

    Point scores (``scores``, ``suites``) are the files' values; intervals come from the
    per-sample records (``samples``), resampled by :mod:`polykv_search.stats`.
    """

    name: str
    kind: str
    solver: str | None
    budget: float | None  # the entry's global budget; None for FullKV
    digest: str
    run: int
    family: str = ""
    scores: dict[str, float] = field(default_factory=dict)
    suites: dict[str, float] = field(default_factory=dict)
    kv_bytes: float | None = None
    full_kv_bytes: float | None = None
    kv_ratio: float | None = None
    gap: dict[str, float | None] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    strategy: dict[str, Any] | None = None
    #: what ``score`` was given for it: a strategy file's path, or a baseline spec (``uniform:snapkv``)
    source: str | None = None
    samples: dict[str, TaskSamples] = field(default_factory=dict)
    #: task -> interval of the task score; suite -> interval of the suite score
    task_iv: dict[str, Interval] = field(default_factory=dict)
    suite_iv: dict[str, Interval] = field(default_factory=dict)
    #: suite -> paired interval of (this row − the best uniform at its budget); None with a note when not computable
    diff: dict[str, Interval | None] = field(default_factory=dict)
    diff_note: dict[str, str] = field(default_factory=dict)
    gap_iv: dict[str, Gap] = field(default_factory=dict)
    #: fidelity per suite (mean over its teacher-forced tasks): KL(FullKV ‖ row), ΔNLL, gap recovered on KL
    kl: dict[str, Interval] = field(default_factory=dict)
    dnll: dict[str, Interval] = field(default_factory=dict)
    kl_gap: dict[str, Gap] = field(default_factory=dict)
    #: suite -> position bucket -> interval of the KL over that bucket's positions (trajectory tasks)
    kl_buckets: dict[str, dict[str, Interval]] = field(default_factory=dict)

    @property
    def is_full(self) -> bool:
        return self.solver == "full" or (self.budget is None and self.solver is None)

    @property
    def is_uniform(self) -> bool:
        return self.solver == "uniform"

    @property
    def kv_mib(self) -> float | None:
        return None if self.kv_bytes is None else self.kv_bytes / MIB

    def to_json(self) -> dict[str, Any]:
        ivs = lambda d: {k: v.to_json() for k, v in d.items()}  # noqa: E731
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "kind": self.kind,
            "solver": self.solver,
            "family": self.family,
            "budget": self.budget,
            "run": self.run,
            "strategy_digest": self.digest,
            "scores": dict(self.scores),
            "suites": dict(self.suites),
            "intervals": {"scores": ivs(self.task_iv), "suites": ivs(self.suite_iv)},
            "vs_best_uniform": {
                s: {
                    "difference": None if d is None else d.to_json(),
                    "resolved": bool(d is not None and d.excludes_zero),
                    "note": self.diff_note.get(s),
                }
                for s, d in self.diff.items()
            },
            "kv_bytes": self.kv_bytes,
            "kv_mib": self.kv_mib,
            "full_kv_bytes": self.full_kv_bytes,
            "kv_ratio": self.kv_ratio,
            "gap_recovered": dict(self.gap),
            "gap_recovered_interval": {s: g.to_json() for s, g in self.gap_iv.items()},
            "fidelity": {
                "kl": ivs(self.kl),
                "dnll": ivs(self.dnll),
                "kl_gap_recovered": {s: g.to_json() for s, g in self.kl_gap.items()},
                "kl_buckets": {s: ivs(b) for s, b in self.kl_buckets.items()},
            },
            "sources": list(self.sources),
            "source": self.source,
        }


@dataclass
class Reference:
    """What differences and gap recovered are measured against, for one run, budget and suite."""

    run: int
    budget: float
    suite: str
    full: str | None
    s_full: float | None
    best_uniform: str | None
    s_best_uniform: float | None
    #: paired interval of FullKV − best uniform; gap recovered is defined only when it lies above 0
    full_minus_uniform: Interval | None = None
    gap_note: str | None = None
    #: the uniform baseline with the lowest KL (the fidelity reference) and its KL
    kl_best_uniform: str | None = None
    kl_best: Interval | None = None
    kl_gap_note: str | None = None

    @property
    def gap_defined(self) -> bool:
        return self.gap_note is None

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for key in ("full_minus_uniform", "kl_best"):
            out[key] = None if out[key] is None else out[key].to_json()
        out["gap_defined"] = self.gap_defined
        return out


@dataclass
class Comparison:
    """The merged rows plus everything needed to render, plot or save them."""

    rows: list[Row]
    suites: list[str]
    tasks: list[str]
    budgets: list[float]
    runs: list[dict[str, Any]]
    references: list[Reference]
    sources: list[str]
    warnings: list[str] = field(default_factory=list)
    statistics: dict[str, Any] = field(default_factory=dict)

    @property
    def multi_budget(self) -> bool:
        return len(self.budgets) > 1

    @property
    def multi_run(self) -> bool:
        return len(self.runs) > 1

    @property
    def has_intervals(self) -> bool:
        return any(r.suite_iv for r in self.rows)

    @property
    def fidelity_suites(self) -> list[str]:
        """Suites for which some row has a KL (teacher-forced tasks of version-2 results)."""
        return [s for s in self.suites if any(s in r.kl for r in self.rows)]

    @property
    def bucket_suites(self) -> dict[str, list[str]]:
        """Suites whose rows have a KL per position bucket (the decode suite), with the buckets in order."""
        out: dict[str, list[str]] = {}
        for s in self.suites:
            names = ordered(b for r in self.rows for b in r.kl_buckets.get(s, {}))
            if names:
                out[s] = names
        return out

    def reference(self, run: int, budget: float | None, suite: str) -> Reference | None:
        for ref in self.references:
            if ref.run == run and ref.budget == budget and ref.suite == suite:
                return ref
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": COMPARISON_SCHEMA,
            "version": COMPARISON_VERSION,
            "definition": "gap_recovered = (S_strategy - S_bestuniform) / (S_full - S_bestuniform) "
            "per run, budget and suite; null when FullKV or every uniform baseline is missing, or when "
            "S_full - S_bestuniform is not clearly positive (its paired interval does not lie above 0; "
            "S_full <= S_bestuniform without per-sample scores). "
            "kl_gap_recovered = (KL_bestuniform - KL_entry) / KL_bestuniform, KL_bestuniform the lowest uniform KL.",
            "statistics": dict(self.statistics),
            "sources": list(self.sources),
            "suites": list(self.suites),
            "tasks": list(self.tasks),
            "budgets": list(self.budgets),
            "runs": list(self.runs),
            "references": [r.to_json() for r in self.references],
            "warnings": list(self.warnings),
            "rows": [r.to_json() for r in self.rows],
        }


# ================================================================================== helpers
def num(v: Any) -> float | None:
    """A finite float, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def finite(v: Any) -> bool:
    return num(v) is not None


def fmt_budget(b: float | None) -> str:
    return "-" if b is None else f"{b:g}"


def ordered(items) -> list:
    """Unique items in first-seen order."""
    seen: dict = {}
    for x in items:
        seen.setdefault(x, None)
    return list(seen)


def layers_of(strategy: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not isinstance(strategy, dict) or not isinstance(strategy.get("layers"), list):
        return []
    return strategy["layers"]
