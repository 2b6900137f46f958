"""Signals per (layer, KV head), stored in the signal table's ``heads`` block (table version 3).

Today one signal: the retrieval score of each KV head (:mod:`signals.retrieval_heads`), its standard
error over samples and the per-sample values, with the provenance of the evidence samples it was
measured on. On disk::

    "heads": null or {
      "num_kv_heads": H,
      "retrieval": {"mean": [L][H], "se": [L][H] (null entries with one sample), "per_sample": [S][L][H]},
      "provenance": {"samples": S, "records": R, "context_len": n, "continuation_len": m, "seed": s,
                     "definition": "..."}
    }
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from signals.retrieval_heads import RetrievalScores
from signals.table_codec import SignalTableError, decode, encode, is_int

DEFINITION = (
    "retrieval score (Wu et al. 2404.15574, teacher-forced): share of answer tokens whose predicting query "
    "attends most to the context token being copied; query heads to KV heads by max; mean over samples"
)


@dataclass(frozen=True)
class HeadSignals:
    """Per-(layer, KV head) signals of a table: the retrieval scores and how they were measured."""

    retrieval: RetrievalScores
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def num_kv_heads(self) -> int:
        return int(self.retrieval.mean.shape[1])

    def to_json(self) -> dict[str, Any]:
        r = self.retrieval
        return {
            "num_kv_heads": self.num_kv_heads,
            "retrieval": {"mean": encode(r.mean), "se": encode(r.se), "per_sample": encode(r.per_sample)},
            "provenance": self.provenance,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadSignals):
            return NotImplemented
        a, b = self.retrieval, other.retrieval
        pairs = zip((a.mean, a.se, a.per_sample), (b.mean, b.se, b.per_sample))
        return all(np.array_equal(x, y, equal_nan=True) for x, y in pairs) and self.provenance == other.provenance


def heads_from_json(block: Any, num_layers: int) -> HeadSignals | None:
    """Read and validate a ``heads`` block (None stays None); errors name the field."""
    if block is None:
        return None
    if not isinstance(block, dict):
        raise SignalTableError("heads: must be an object or null")
    unknown = sorted(set(block) - {"num_kv_heads", "retrieval", "provenance"})
    if unknown:
        raise SignalTableError(f"heads: unknown keys {unknown}")
    h = block.get("num_kv_heads")
    if not is_int(h) or h < 1:
        raise SignalTableError(f"heads.num_kv_heads: must be a positive integer, got {h!r}")
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
    return HeadSignals(RetrievalScores(mean, se, per_sample), dict(provenance))
