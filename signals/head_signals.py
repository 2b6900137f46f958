"""Signals per (layer, KV head), stored in the signal table's ``heads`` block (table version 3; 4 with cells;
5 with prefill cells of scored patterns).

The retrieval score of each KV head (:mod:`signals.retrieval_heads`), its standard error over samples and
the per-sample values, with the provenance of the evidence samples it was measured on; optionally the
*streaming cells* (:mod:`signals.head_cells`): per (layer, KV head, budget), KL(FullKV || only that KV head
keeps sinks + recent tokens) on answer tokens and on prose; optionally the *prefill cells* of scored patterns
(:mod:`signals.head_prefill_cells`): the same KL when only that KV head compresses its prompt with snapkv,
h2o, ... and keeps every continuation token. On disk::

    "heads": null or {
      "num_kv_heads": H,
      "retrieval": {"mean": [L][H], "se": [L][H] (null entries with one sample), "per_sample": [S][L][H]},
      "provenance": {"samples": S, "records": R, "context_len": n, "continuation_len": m, "seed": s,
                     "definition": "..."},
      "cells": {                                   # optional; version 4 on
        "pattern": "streaming_llm", "sink": 4, "budgets": [b1, ...],     # strictly increasing, each > sink
        "kl_answer": {"mean": [L][H][nb], "se": [L][H][nb] (null with one sample)},
        "kl_prose": {"mean": [L][H][nb], "se": [L][H][nb]},
        "provenance": {...}
      },
      "prefill_cells": [{"pattern": "snapkv", "params": {}, "budgets": [...],   # optional; version 5 only
                         "kl_answer": ..., "kl_prose": ..., "provenance": {...}}, ...]
    }
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from signals.head_prefill_cells import CellArrays, PrefillCells, decode_kl, prefill_cells_from_json
from signals.retrieval_heads import RetrievalScores
from signals.table_codec import SignalTableError, check_budgets, decode, encode, is_int

DEFINITION = (
    "retrieval score (Wu et al. 2404.15574, teacher-forced): share of answer tokens whose predicting query "
    "attends most to the context token being copied; query heads to KV heads by max; mean over samples"
)


#: The pattern of the streaming cells.
CELL_PATTERN = "streaming_llm"
_CELL_KEYS = ("budgets", "kl_answer", "kl_prose", "pattern", "provenance", "sink")


@dataclass(frozen=True)
class HeadCells(CellArrays):
    """Streaming cells per (layer, KV head, budget): mean KL(FullKV || cell) over samples and its standard
    error (NaN with one sample), on answer tokens of evidence samples and on prose (:mod:`signals.head_cells`)."""

    sink: int
    budgets: tuple[int, ...]
    kl_answer_mean: np.ndarray  #: [L, H, nb]
    kl_answer_se: np.ndarray
    kl_prose_mean: np.ndarray
    kl_prose_se: np.ndarray
    provenance: dict[str, Any] = field(default_factory=dict)
    pattern: str = CELL_PATTERN
    #: The phases the cells measure the pattern in (the head streams while the continuation is decoded).
    phases = ("prefill", "decoding")

    def to_json(self) -> dict[str, Any]:
        a, sa, p, sp = self.arrays
        return {
            "pattern": self.pattern,
            "sink": self.sink,
            "budgets": list(self.budgets),
            "kl_answer": {"mean": encode(a), "se": encode(sa)},
            "kl_prose": {"mean": encode(p), "se": encode(sp)},
            "provenance": self.provenance,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadCells):
            return NotImplemented
        return self._same_arrays(other) and (self.pattern, self.sink, tuple(self.budgets), self.provenance) == (
            other.pattern,
            other.sink,
            tuple(other.budgets),
            other.provenance,
        )


@dataclass(frozen=True)
class HeadSignals:
    """Per-(layer, KV head) signals of a table: the retrieval scores and how they were measured, and
    optionally the streaming cells and the prefill cells of scored patterns (one per pattern)."""

    retrieval: RetrievalScores
    provenance: dict[str, Any] = field(default_factory=dict)
    cells: HeadCells | None = None
    prefill_cells: tuple[PrefillCells, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_cells", tuple(self.prefill_cells))
        named: list[tuple[str, CellArrays]] = [("heads.cells", self.cells)] if self.cells is not None else []
        named += [(f"heads.prefill_cells[{i}]", c) for i, c in enumerate(self.prefill_cells)]
        for where, cells in named:
            if cells.kl_answer_mean.shape[:2] != self.retrieval.mean.shape:
                raise SignalTableError(
                    f"{where}: {cells.kl_answer_mean.shape[:2]} (layers, KV heads) for retrieval scores of "
                    f"{self.retrieval.mean.shape}"
                )
        patterns = [c.pattern for c in self.prefill_cells]
        if len(set(patterns)) != len(patterns):
            raise SignalTableError(f"heads.prefill_cells: one block per pattern, got {patterns}")

    @property
    def cell_sets(self) -> tuple[HeadCells | PrefillCells, ...]:
        """Every kind of head cells the table holds: the streaming cells first, then the prefill cells."""
        return ((self.cells,) if self.cells is not None else ()) + self.prefill_cells

    @property
    def num_kv_heads(self) -> int:
        return int(self.retrieval.mean.shape[1])

    def to_json(self) -> dict[str, Any]:
        r = self.retrieval
        return {
            "num_kv_heads": self.num_kv_heads,
            "retrieval": {"mean": encode(r.mean), "se": encode(r.se), "per_sample": encode(r.per_sample)},
            "provenance": self.provenance,
            **({} if self.cells is None else {"cells": self.cells.to_json()}),
            **({"prefill_cells": [c.to_json() for c in self.prefill_cells]} if self.prefill_cells else {}),
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadSignals):
            return NotImplemented
        a, b = self.retrieval, other.retrieval
        pairs = zip((a.mean, a.se, a.per_sample), (b.mean, b.se, b.per_sample))
        same = all(np.array_equal(x, y, equal_nan=True) for x, y in pairs) and self.provenance == other.provenance
        return same and self.cells == other.cells and self.prefill_cells == other.prefill_cells


def heads_from_json(block: Any, num_layers: int, version: int = 4) -> HeadSignals | None:
    """Read and validate a ``heads`` block (None stays None) of a table of ``version`` (``cells`` from 4 on,
    ``prefill_cells`` from 5 on); errors name the field."""
    if block is None:
        return None
    if not isinstance(block, dict):
        raise SignalTableError("heads: must be an object or null")
    known = {"num_kv_heads", "retrieval", "provenance"} | ({"cells"} if version >= 4 else set())
    known |= {"prefill_cells"} if version >= 5 else set()
    unknown = sorted(set(block) - known)
    if unknown:
        raise SignalTableError(f"heads: unknown keys {unknown} for version {version}")
    h = block.get("num_kv_heads")
    if not is_int(h) or h < 1:
        raise SignalTableError(f"heads.num_kv_heads: must be a positive integer, got {h!r}")
    h = int(h)
    r = block.get("retrieval")
    if not isinstance(r, dict) or sorted(r) != ["mean", "per_sample", "se"]:
        raise SignalTableError("heads.retrieval: expected an object with the keys mean, se, per_sample")
    per = r["per_sample"]
    n = len(per) if isinstance(per, list) else 0
    if n < 1:
        raise SignalTableError("heads.retrieval.per_sample: expected a non-empty list of [L][H] samples")
    mean = decode("heads.retrieval.mean", r["mean"], (num_layers, h), ("layers", "KV heads"))
    se = decode("heads.retrieval.se", r["se"], (num_layers, h), ("layers", "KV heads"))
    per_sample = decode("heads.retrieval.per_sample", per, (n, num_layers, h), ("samples", "layers", "KV heads"))
    for name, arr in (("mean", mean), ("per_sample", per_sample)):
        if np.isnan(arr).any() or (arr < 0).any() or (arr > 1).any():
            raise SignalTableError(f"heads.retrieval.{name}: every value must be a share in [0, 1]")
    if (se < 0).any():
        raise SignalTableError("heads.retrieval.se: standard errors must be >= 0")
    provenance = block.get("provenance") or {}
    if not isinstance(provenance, dict):
        raise SignalTableError("heads.provenance: must be an object")
    cells = block.get("cells")
    cells = None if cells is None else cells_from_json(cells, num_layers, h)
    scored = block.get("prefill_cells")
    scored = () if scored is None else prefill_cells_from_json(scored, num_layers, h)
    return HeadSignals(RetrievalScores(mean, se, per_sample), dict(provenance), cells, scored)


def cells_from_json(block: Any, num_layers: int, num_kv_heads: int) -> HeadCells:
    """Read and validate a ``heads.cells`` block; errors name the field."""
    if not isinstance(block, dict) or sorted(block) != sorted(_CELL_KEYS):
        got = sorted(block) if isinstance(block, dict) else type(block).__name__
        raise SignalTableError(f"heads.cells: expected an object with the keys {', '.join(_CELL_KEYS)}, got {got}")
    if block["pattern"] != CELL_PATTERN:
        raise SignalTableError(f"heads.cells.pattern: must be {CELL_PATTERN!r}, got {block['pattern']!r}")
    sink = block["sink"]
    if not is_int(sink) or sink < 0:
        raise SignalTableError(f"heads.cells.sink: must be a non-negative integer, got {sink!r}")
    try:
        budgets = check_budgets(block["budgets"])
    except SignalTableError as err:
        raise SignalTableError(f"heads.cells.{err}") from None
    if budgets[0] <= sink:
        raise SignalTableError(f"heads.cells.budgets: every budget must exceed the sink ({sink}), got {list(budgets)}")
    arrays = decode_kl("heads.cells", block, (num_layers, num_kv_heads, len(budgets)))
    provenance = block["provenance"]
    if not isinstance(provenance, dict):
        raise SignalTableError("heads.cells.provenance: must be an object")
    return HeadCells(int(sink), budgets, *arrays, dict(provenance), pattern=CELL_PATTERN)
