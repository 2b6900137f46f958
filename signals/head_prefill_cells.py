"""Prefill cells of scored patterns per (layer, KV head), stored in the signal table's ``heads.prefill_cells``.

The streaming cells (``heads.cells``, :mod:`signals.head_signals`) say what it costs when one KV head keeps
sinks + recent tokens in both phases. A *prefill cell* (:func:`signals.head_prefill_measure.sample_prefill_cells_kl`)
says what it costs when only KV head h of layer l compresses its **prompt** to budget b with a scored pattern
(snapkv, h2o, ...: one whose selection is made per KV head) and keeps every continuation token: KL(FullKV ||
cell) on the answer tokens of evidence samples and on prose, mean over samples and standard error. On disk
(table version 5; one block per pattern, patterns unique, never ``streaming_llm``, whose cells are
``heads.cells``). ``kvzip``'s cells run its reconstruction pass once per sample. A pooled pattern
(``kvzip[allocation=model]``) measures the head as the only cell of its pool, i.e. its own top ``b``
(:meth:`~polykv_search.patterns.Pattern.alone`); its ``params`` tell the solvers to pool the heads they give it::

    "prefill_cells": [
      {"pattern": "snapkv", "params": {} (the pattern's parameters; {}: its defaults),
       "budgets": [b1, ...] (strictly increasing positive integers),
       "kl_answer": {"mean": [L][H][nb], "se": [L][H][nb] (null with one sample)},
       "kl_prose": {"mean": [L][H][nb], "se": [L][H][nb]},
       "provenance": {...}},
      ...
    ]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polykv_search.patterns import make_pattern
from signals.table_codec import SignalTableError, check_budgets, decode, encode

#: Patterns whose prefill selection is made per KV head, so that a head in a group of its own keeps what
#: the layer-level pattern keeps in that head (tova is not: one selection shared by the layer's heads).
PREFILL_CELL_PATTERNS = (
    "snapkv",
    "pyramidkv",
    "h2o",
    "knorm",
    "keydiff",
    "expected_attention",
    "kvzip",
    "streaming_llm",
)
#: Of those, the ones stored as prefill cells (streaming_llm's cells are the streaming cells, both phases).
SCORED_CELL_PATTERNS = tuple(p for p in PREFILL_CELL_PATTERNS if p != "streaming_llm")
_KEYS = ("budgets", "kl_answer", "kl_prose", "params", "pattern", "provenance")


class CellArrays:
    """What every kind of head cells shares: ``budgets`` and four ``[L, H, nb]`` arrays (answer and prose KL,
    mean and standard error, NaN where unknown)."""

    budgets: tuple[int, ...]
    kl_answer_mean: np.ndarray
    kl_answer_se: np.ndarray
    kl_prose_mean: np.ndarray
    kl_prose_se: np.ndarray

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.kl_answer_mean, self.kl_answer_se, self.kl_prose_mean, self.kl_prose_se)

    def budget_index(self, budget: int) -> int:
        if budget not in self.budgets:
            raise ValueError(f"budget {budget} is not one of the cells' budgets {list(self.budgets)}")
        return self.budgets.index(budget)

    def costliest(self, k: int, budget: int, signal: str = "answer") -> list[tuple[int, int, float, float]]:
        """The ``k`` cells of ``budget`` with the highest mean KL: ``(layer, kv head, mean, se)``; ties
        towards lower layers and heads."""
        g = self.budget_index(budget)
        mean, se = (self.kl_answer_mean, self.kl_answer_se) if signal == "answer" else self.arrays[2:]
        flat = sorted(np.ndindex(mean.shape[:2]), key=lambda lh: (-mean[lh][g], lh))
        return [(int(l), int(h), float(mean[l, h, g]), float(se[l, h, g])) for l, h in flat[:k]]

    def _same_arrays(self, other: CellArrays) -> bool:
        return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(self.arrays, other.arrays))


@dataclass(frozen=True, eq=False)
class PrefillCells(CellArrays):
    """One scored pattern's prefill cells per (layer, KV head, budget) (module docstring)."""

    pattern: str
    budgets: tuple[int, ...]
    kl_answer_mean: np.ndarray  #: [L, H, nb]
    kl_answer_se: np.ndarray
    kl_prose_mean: np.ndarray
    kl_prose_se: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    #: The phases the cells measure the pattern in (the continuation keeps every token).
    phases = ("prefill",)

    def to_json(self) -> dict[str, Any]:
        a, sa, p, sp = self.arrays
        return {
            "pattern": self.pattern,
            "params": dict(self.params),
            "budgets": list(self.budgets),
            "kl_answer": {"mean": encode(a), "se": encode(sa)},
            "kl_prose": {"mean": encode(p), "se": encode(sp)},
            "provenance": self.provenance,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrefillCells):
            return NotImplemented
        key = lambda c: (c.pattern, c.params, tuple(c.budgets), c.provenance)  # noqa: E731
        return key(self) == key(other) and self._same_arrays(other)

    __hash__ = None  # type: ignore[assignment]


def decode_kl(
    where: str, block: dict, shape: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``[answer mean, answer se, prose mean, prose se]`` of a cells block; errors name the field."""
    arrays = []
    for signal in ("kl_answer", "kl_prose"):
        part = block[signal]
        if not isinstance(part, dict) or sorted(part) != ["mean", "se"]:
            raise SignalTableError(f"{where}.{signal}: expected an object with the keys mean, se")
        for key in ("mean", "se"):
            name = f"{where}.{signal}.{key}"
            arr = decode(name, part[key], shape, ("layers", "KV heads", "budgets"))
            if key == "mean" and np.isnan(arr).any():
                raise SignalTableError(f"{name}: every cell needs a value (null only in se)")
            if (arr < 0).any():
                raise SignalTableError(f"{name}: values must be >= 0")
            arrays.append(arr)
    answer_mean, answer_se, prose_mean, prose_se = arrays
    return answer_mean, answer_se, prose_mean, prose_se


def prefill_cells_from_json(blocks: Any, num_layers: int, num_kv_heads: int) -> tuple[PrefillCells, ...]:
    """Read and validate a ``heads.prefill_cells`` list; errors name the field (``heads.prefill_cells[i]...``)."""
    if not isinstance(blocks, list) or not blocks:
        raise SignalTableError("heads.prefill_cells: expected a non-empty list of pattern blocks")
    out: list[PrefillCells] = []
    for i, block in enumerate(blocks):
        where = f"heads.prefill_cells[{i}]"
        if not isinstance(block, dict) or sorted(block) != sorted(_KEYS):
            got = sorted(block) if isinstance(block, dict) else type(block).__name__
            raise SignalTableError(f"{where}: expected an object with the keys {', '.join(_KEYS)}, got {got}")
        pattern, params = block["pattern"], block["params"]
        if pattern not in SCORED_CELL_PATTERNS:
            raise SignalTableError(f"{where}.pattern: must be one of {list(SCORED_CELL_PATTERNS)}, got {pattern!r}")
        if any(c.pattern == pattern for c in out):
            raise SignalTableError(f"{where}.pattern: {pattern!r} appears twice")
        if not isinstance(params, dict):
            raise SignalTableError(f"{where}.params: must be an object")
        try:
            make_pattern(pattern, **params)
        except (TypeError, ValueError) as err:
            raise SignalTableError(f"{where}.params: {err}") from None
        try:
            budgets = check_budgets(block["budgets"])
        except SignalTableError as err:
            raise SignalTableError(f"{where}.{err}") from None
        arrays = decode_kl(where, block, (num_layers, num_kv_heads, len(budgets)))
        if not isinstance(block["provenance"], dict):
            raise SignalTableError(f"{where}.provenance: must be an object")
        out.append(PrefillCells(pattern, budgets, *arrays, dict(params), dict(block["provenance"])))
    return tuple(out)
