"""Score strategies and baselines on the same generated samples with the same runtime.

The library side of ``polykv-search score`` (also used by the Optuna solver and quickstart):
samples are generated once per task from the evaluation split of a corpus
(:mod:`~polykv_search.scoring.tasks`); :func:`score_entries` runs them for every entry, by default
with the shared engine (one FullKV context pass per sample, entries batched:
:mod:`~polykv_search.scoring.shared`), or entry by entry (:mod:`~polykv_search.scoring.per_entry`, the
reference); :mod:`~polykv_search.scoring.document` writes the results file.
"""

from polykv_search.scoring.cost import run_costs, sample_cost
from polykv_search.scoring.document import (
    READABLE_VERSIONS,
    RESULTS_SCHEMA,
    RESULTS_VERSION,
    entry_record,
    results_document,
)
from polykv_search.scoring.engine import ENGINES, score_entries, score_entry, shared_scorer
from polykv_search.scoring.entries import Entry, ScoreError
from polykv_search.scoring.shared import SharedScorer, plan_groups
from polykv_search.scoring.tasks import eval_texts, make_task_samples, resolve_tasks

__all__ = [
    "ENGINES",
    "READABLE_VERSIONS",
    "RESULTS_SCHEMA",
    "RESULTS_VERSION",
    "Entry",
    "ScoreError",
    "SharedScorer",
    "entry_record",
    "eval_texts",
    "make_task_samples",
    "plan_groups",
    "resolve_tasks",
    "results_document",
    "run_costs",
    "sample_cost",
    "score_entries",
    "score_entry",
    "shared_scorer",
]
