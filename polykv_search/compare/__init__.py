"""Compare score results: one table of strategies and baselines, intervals, gap recovered, plots.

The library side of ``polykv-search compare``. It reads results files written by
``polykv-search score`` (schema ``polykv-results`` v1 or v2), checks that they were made on the
same samples, model and budget (or groups them by budget when told), merges their entries into
one list of rows (deduplicated by strategy digest + budget) and computes, per budget and suite:

* every task and suite score with its 95 % bootstrap interval (:mod:`polykv_search.stats`:
  samples resampled within each task, every entry on the same resamples);
* each row's paired difference to the best uniform baseline at its budget — *resolved* when its
  interval excludes 0;
* the **gap recovered** (docs/design.md §2) with its interval::

      gap = (S_strategy - S_bestuniform) / (S_full - S_bestuniform)

  where ``S_bestuniform`` is the best uniform single-pattern baseline (solver ``uniform``) at that
  budget on that suite and ``S_full`` the FullKV entry. It is ``None`` (a dash in the tables, the reason in a note)
  when FullKV or every uniform baseline is missing, or when ``S_full - S_bestuniform`` is not
  clearly positive (its paired interval does not lie above 0);
* on teacher-forced tasks of v2 results, fidelity: KL(FullKV ‖ entry), ΔNLL and the gap
  recovered on KL, ``(KL_u - KL) / KL_u`` against the lowest-KL uniform baseline.

Modules: :mod:`~.reading` (files), :mod:`~.model` (rows, references), :mod:`~.merging`
(:func:`compare`), :mod:`~.gaps` (references, intervals), :mod:`~.tables` (markdown, rich,
:func:`summary_table`), :mod:`~.summary` (notes, :func:`unresolved`), :mod:`~.plots`, :mod:`~.verdict`
(sentences), :mod:`~.recommend` (the entry to use per budget, by :data:`RULE`) and :mod:`~.deploy` (its export
command or the runtime snippet).

Typical use::

    docs = [load_results(p) for p in paths]
    comparison = compare(docs, sources=paths)
    print(to_markdown(comparison))
    plot(comparison, "compare.png")
"""

from polykv_search.compare.gaps import aligned, best_uniform, best_uniform_kl, gap_recovered
from polykv_search.compare.merging import RUNTIME_SETTINGS, compare
from polykv_search.compare.model import COMPARISON_SCHEMA, COMPARISON_VERSION, MIB, Comparison, Reference, Row
from polykv_search.compare.plots import pattern_colors, plot
from polykv_search.compare.reading import (
    SUPPORTED_VERSIONS,
    CompareError,
    TaskSamples,
    check_results,
    entry_samples,
    load_results,
)
from polykv_search.compare.recommend import RULE, Recommendation, brief, recommend
from polykv_search.compare.summary import describe, notes, unresolved, unresolved_warning
from polykv_search.compare.tables import (
    Column,
    best_cells,
    columns,
    summary_table,
    to_markdown,
    to_rich,
    to_rich_pages,
)

__all__ = [
    "COMPARISON_SCHEMA",
    "COMPARISON_VERSION",
    "MIB",
    "RULE",
    "RUNTIME_SETTINGS",
    "SUPPORTED_VERSIONS",
    "Column",
    "CompareError",
    "Comparison",
    "Recommendation",
    "Reference",
    "Row",
    "TaskSamples",
    "aligned",
    "best_cells",
    "best_uniform",
    "best_uniform_kl",
    "brief",
    "check_results",
    "columns",
    "compare",
    "describe",
    "entry_samples",
    "gap_recovered",
    "load_results",
    "notes",
    "pattern_colors",
    "plot",
    "recommend",
    "summary_table",
    "to_markdown",
    "to_rich",
    "to_rich_pages",
    "unresolved",
    "unresolved_warning",
]
