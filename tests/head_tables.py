"""Synthetic signal tables with a ``heads`` block: retrieval scores and (optionally) streaming cells.

The cells are written in the format the head-cells collector stores (``heads.cells``), through a
``HeadSignals`` subclass that carries them, so the solvers read them as they will read real ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from signals.head_signals import HeadSignals
from signals.retrieval_heads import RetrievalScores
from signals.synthetic import random_signal_table


@dataclass(frozen=True, eq=False)
class HeadsWithCells(HeadSignals):
    """Cells as a raw ``heads.cells`` dict (malformed ones included), for the solvers' own reader."""

    cells: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        pass

    def to_json(self) -> dict[str, Any]:
        return {**HeadSignals(self.retrieval, self.provenance).to_json(), "cells": self.cells}


def cells_block(L: int, H: int, budgets, seed: int = 0, se: bool = True, pattern: str = "streaming_llm") -> dict:
    """KL per (layer, head, budget): decreasing in the budget, a few heads far more sensitive."""
    rng = np.random.default_rng(seed)
    grid = np.asarray(budgets, dtype=float)
    sens = rng.gamma(0.7, 1.0, size=(L, H, 1)) * (1 + 20 * (rng.random((L, H, 1)) < 0.15))
    decay = (grid.min() / grid) ** 0.8
    block = {"pattern": pattern, "budgets": [int(b) for b in budgets]}
    for name, scale in (("kl_answer", 1.0), ("kl_prose", 0.2)):
        mean = scale * sens * decay[None, None, :] * (1 + rng.normal(0, 0.05, size=(L, H, len(grid))))
        err = np.abs(mean) * rng.uniform(0.05, 0.3, size=mean.shape)
        block[name] = {"mean": mean.tolist(), "se": err.tolist() if se else None}
    return block


def random_heads(L: int, H: int, seed: int = 0, context_len: int = 128, scores=None) -> HeadSignals:
    """Retrieval scores only (a heads block as ``collect --retrieval-heads`` writes it today)."""
    rng = np.random.default_rng(seed + 1)
    mean = rng.beta(0.4, 3.0, size=(L, H)) if scores is None else np.asarray(scores, dtype=float)
    per = np.clip(mean[None] + rng.normal(0, 0.01, size=(2, L, H)), 0, 1)
    prov = {"samples": 2, "records": 1, "context_len": context_len, "continuation_len": 16, "seed": seed}
    return HeadSignals(RetrievalScores(mean, np.full((L, H), 0.01), per), prov)


def table_with_heads(
    L: int = 4,
    H: int = 3,
    *,
    seed: int = 0,
    cells: dict | None | bool = True,
    context_len: int = 256,
    budgets=(16, 32, 64),
    scores: np.ndarray | None = None,
):
    """A random layer-level table plus a heads block (retrieval scores, cells unless ``cells=False``)."""
    table = random_signal_table(
        L, budgets=(8, 16, 32, 64), patterns=("snapkv", "tova", "h2o", "streaming_llm"), seed=seed
    )
    heads = random_heads(L, H, seed, context_len, scores)
    block = cells_block(L, H, budgets, seed) if cells is True else (cells or None)
    table.set_heads(heads if block is None else HeadsWithCells(heads.retrieval, heads.provenance, block))
    return table
