"""What head-level solvers (``duo``, ``headkv``, ``ilp``/``dp --granularity head``) read and build.

Reading: the signal table's ``heads`` block (:mod:`signals.head_signals`): the per-KV-head retrieval
score (``heads.retrieval.mean``, ``[L][H]``) and, when ``collect --head-cells`` measured them, the
streaming cells::

    "cells": {"pattern": "streaming_llm", "budgets": [b1, ...], "sink": s (optional),
              "params": {...} (optional; default {"n_sink": sink} for streaming_llm cells),
              "kl_answer": {"mean": [L][H][nb], "se": [L][H][nb]},
              "kl_prose": {"mean": [L][H][nb], "se": [L][H][nb]}}

KL(FullKV ‖ cell) when only head (l, h) keeps ``pattern`` at budget b (every other head keeps all),
and, when ``collect --head-patterns`` measured them, the prefill cells of scored patterns
(``heads.prefill_cells``: a list of such blocks, one per pattern, with ``params``; only the head's prompt is
compressed, it keeps every continuation token). :func:`head_cells` reads the streaming cells and
:func:`head_cell_sets` every kind (streaming first), as parsed attributes (objects with those fields or those
dicts); both are tolerant of their absence. ``se`` entries may be null (one sample).

Building: :func:`grouped_plan` turns one ``(pattern, budget, params)`` per (layer, KV head) into one
:class:`~strategies.LayerChoice` with head groups per layer (heads with equal choices share a group; heads of
a pooled pattern, ``kvzip[allocation=model]``, get a group each: the runtime pools every head given it, so
the heads keep different numbers of tokens at the same total, :mod:`polykv_search.runtime.pooled`),
the same for every optimized phase: decoding follows prefill's heads (a head that keeps the whole
context in prefill keeps its generated tokens too; a streaming head keeps streaming).

Phases the table lacks. The head signals (retrieval scores, streaming cells) do not depend on the table's
layer-level phases, and a streaming cell is measured with the head streaming in both phases. So a phase
that is not optimized (the default ``collect`` writes a prefill-only table, so ``--phases`` defaults to
prefill) gets the optimized phase's head groups too (:attr:`Plan.follows`), **not** the uniform default
of layer-level solvers: a keep-all head followed in decoding by a layer-level ``snapkv`` at B would evict
what it kept at the first step. The strategy's provenance records it (``phases_following``) and the
solver's summary line says it ("decoding follows prefill's head groups").

The context length a head-level strategy is built for (a keep-all head's budget) is, in order: the
solver's ``target_context_len`` setting (``--target-context-len``), the problem's ``max_budget``
(``--max-budget``), the head signals' calibration ``context_len``, the table's ``context_len``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polykv_search.models import MAX_CONTEXT_LEN
from polykv_search.patterns import PATTERNS, make_pattern
from signals.table import SignalTable
from solvers.problem import Problem
from solvers.result import Plan
from solvers.settings import SolverError, setting
from strategies.head_groups import group_heads
from strategies.strategy import PHASES, LayerChoice

CELLS_OPTION = "--head-cells"
RETRIEVAL_OPTION = "--retrieval-heads"
CELL_SIGNALS = ("kl_answer", "kl_prose")


@dataclass(frozen=True)
class HeadCells:
    """One pattern's cells per (layer, KV head, budget): KL means and standard errors (NaN: unknown), the
    pattern's params and the phases the cells measured it in (streaming cells: both; prefill cells: prefill)."""

    pattern: str
    budgets: tuple[int, ...]
    mean: Mapping[str, np.ndarray]  #: signal -> [L, H, nb]
    se: Mapping[str, np.ndarray]  #: signal -> [L, H, nb], NaN where unknown
    params: Mapping[str, Any] = field(default_factory=dict)
    phases: tuple[str, ...] = PHASES

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(next(iter(self.mean.values())).shape)


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _array(where: str, value: Any, shape: tuple[int, ...], allow_null: bool) -> np.ndarray:
    try:
        arr = np.asarray(
            [[[np.nan if v is None else v for v in row] for row in layer] for layer in value] if allow_null else value,
            dtype=np.float64,
        )
    except (TypeError, ValueError):
        raise SolverError(f"{where}: expected numbers shaped [layers][KV heads][budgets]") from None
    if arr.shape != shape:
        raise SolverError(f"{where}: shape {list(arr.shape)}, expected {list(shape)} (layers, KV heads, budgets)")
    return arr


def head_cells(table: SignalTable | None) -> HeadCells | None:
    """The table's streaming cells, or None when it has none (no ``heads`` block or no ``cells``)."""
    heads = getattr(table, "heads", None)
    cells = getattr(heads, "cells", None) if heads is not None else None
    return None if cells is None else _read_cells(table, heads, cells, "heads.cells", PHASES)


def head_cell_sets(table: SignalTable | None) -> list[HeadCells]:
    """Every kind of cells the table holds, one per pattern: the streaming cells first, then the prefill cells
    of scored patterns (``heads.prefill_cells``) in the table's order; [] when it has none."""
    heads = getattr(table, "heads", None)
    if heads is None:
        return []
    out = [] if (streaming := head_cells(table)) is None else [streaming]
    scored = getattr(heads, "prefill_cells", None) or ()
    if isinstance(scored, Mapping) or isinstance(scored, str):
        raise SolverError("heads.prefill_cells: must be a list of pattern blocks")
    for i, block in enumerate(scored):
        out.append(_read_cells(table, heads, block, f"heads.prefill_cells[{i}]", ("prefill",)))
    patterns = [c.pattern for c in out]
    if len(set(patterns)) != len(patterns):
        raise SolverError(f"heads: one kind of cells per pattern, got {patterns}")
    return out


def _read_cells(table, heads, cells, where: str, phases: tuple[str, ...]) -> HeadCells:
    if isinstance(cells, HeadCells):
        return cells
    if hasattr(cells, "kl_answer_mean"):  # the collector's cells (signals.head_signals / head_prefill_cells)
        cells = {
            "pattern": cells.pattern,
            "budgets": list(cells.budgets),
            "kl_answer": {"mean": cells.kl_answer_mean, "se": cells.kl_answer_se},
            "kl_prose": {"mean": cells.kl_prose_mean, "se": cells.kl_prose_se},
            "sink": getattr(cells, "sink", None),
            "params": getattr(cells, "params", None),
        }
    pattern, budgets = _get(cells, "pattern"), _get(cells, "budgets")
    if not isinstance(pattern, str):
        raise SolverError(f"{where}.pattern: must be a pattern name")
    try:
        grid = tuple(int(b) for b in budgets)
    except (TypeError, ValueError):
        raise SolverError(f"{where}.budgets: must be a list of integers") from None
    if not grid or list(grid) != sorted(set(grid)) or grid[0] < 1:
        raise SolverError(f"{where}.budgets: must be increasing positive integers, got {list(grid)}")
    L, H = table.num_layers, int(_get(heads, "num_kv_heads"))
    shape = (L, H, len(grid))
    mean, se = {}, {}
    for name in CELL_SIGNALS:
        block = _get(cells, name)
        if block is None:
            raise SolverError(f"{where}.{name}: missing")
        mean[name] = _array(f"{where}.{name}.mean", _get(block, "mean"), shape, allow_null=False)
        s = _get(block, "se")
        se[name] = np.full(shape, np.nan) if s is None else _array(f"{where}.{name}.se", s, shape, True)
    params = _get(cells, "params")
    if params is None:  # the collector stores the sinks it measured with as ``sink``
        sink = _get(cells, "sink")
        params = {"n_sink": int(sink)} if pattern == "streaming_llm" and sink is not None else {}
    if not isinstance(params, Mapping):
        raise SolverError(f"{where}.params: must be an object")
    return HeadCells(pattern, grid, mean, se, dict(params), phases)


def retrieval_scores(table: SignalTable | None, solver: str) -> np.ndarray:
    """``[L, H]`` mean retrieval score per KV head; SolverError naming the ``collect`` option if absent."""
    heads = getattr(table, "heads", None)
    if heads is None or getattr(heads, "retrieval", None) is None:
        raise SolverError(
            f"{solver}: the signal table has no retrieval-head scores; collect them with "
            f"`polykv-search collect {RETRIEVAL_OPTION} N ...`"
        )
    return np.asarray(heads.retrieval.mean, dtype=np.float64)


def target_context_setting() -> Any:
    """The head-level solvers' ``target_context_len`` setting (read by :func:`context_length`)."""
    return setting(
        None,
        "head-level strategies: the context length they are built for, a keep-all head's budget (default: "
        f"--max-budget, else the head signals' calibration context length; at most {MAX_CONTEXT_LEN:,})",
        most=MAX_CONTEXT_LEN,
    )


def context_length(problem: Problem, explicit: int | None, solver: str) -> int:
    """The context length a head-level strategy is built for (module docstring, in that order)."""
    if explicit is not None:
        return int(explicit)
    if problem.max_budget is not None:
        return int(problem.max_budget)
    table = problem.table
    heads = getattr(table, "heads", None)
    for source in (getattr(heads, "provenance", None), getattr(table, "provenance", None)):
        n = source.get("context_len") if isinstance(source, Mapping) else None
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            return n
    raise SolverError(f"{solver}: no context length; give --target-context-len (a keep-all head's budget)")


def grouped_plan(
    problem: Problem,
    per_head: Sequence[Sequence[tuple[str, int, Mapping[str, Any]]]],
    context_len: int,
    **plan: Any,
) -> Plan:
    """A :class:`Plan` whose every optimized phase gets, per layer, the head groups of ``per_head``
    (``[L][H]`` of ``(pattern, budget, params)``), and every other phase follows the first optimized one
    (module docstring); ``plan`` are the other Plan fields."""
    choices = [LayerChoice.grouped(group_heads(row, alone=_pooled)) for row in per_head]
    optimized = list(problem.phases)
    follows = {phase: optimized[0] for phase in PHASES if phase not in optimized}
    return Plan(
        {phase: list(choices) for phase in optimized},
        context_len=context_len,
        num_kv_heads=len(per_head[0]),
        follows=follows,
        **plan,
    )


def _pooled(pattern: str, params: Mapping[str, Any]) -> bool:
    """Whether the heads given ``pattern`` join a pool (``kvzip[allocation=model]``), so each needs a group of
    its own (:mod:`polykv_search.runtime.pooled`)."""
    return pattern in PATTERNS and make_pattern(pattern, **params).pooled is not None


def head_total(problem: Problem, num_kv_heads: int) -> int:
    """Tokens the (layer, KV head) budgets may sum to: ``H · floor(L·B)``, so the layers' means sum to at
    most ``floor(L·B)``, the total every layer-level solver gets."""
    return num_kv_heads * problem.total


__all__ = [
    "CELLS_OPTION",
    "HeadCells",
    "context_length",
    "grouped_plan",
    "head_cell_sets",
    "head_cells",
    "head_total",
    "retrieval_scores",
]
