"""A plausible random signal table for tests and benchmarks (not calibration data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from signals.table import SignalTable
from strategies import PHASES


def random_signal_table(
    num_layers: int = 8,
    phases: Sequence[str] = PHASES,
    patterns: Sequence[str] = ("snapkv", "tova", "h2o", "streaming_llm"),
    budgets: Sequence[int] = (32, 64, 128, 256),
    *,
    seed: int = 0,
    missing: float = 0.0,
    samples: int | None = None,
    noise: float = 0.5,
    provenance: Mapping[str, Any] | None = None,
) -> SignalTable:
    """A random table with the shape of a real one.

    Per layer a random sensitivity, per (layer, pattern) a random affinity; ΔPPL decreases and
    cosine increases with the budget, with noise; KL is about ΔPPL / 20 and never negative.
    ``missing`` is the fraction of cells left NaN. ``samples=S`` also draws S per-sample values per
    cell (ΔPPL with standard deviation ``noise · (1 + true ΔPPL)``, so small cells can come out
    negative), makes the table's values their means and records standard errors with S − 1 degrees
    of freedom.
    """
    rng = np.random.default_rng(seed)
    table = SignalTable.empty(num_layers, phases, patterns, budgets, provenance or {"model": "synthetic", "seed": seed})
    L, F, P, G = table.shape
    grid = np.asarray(table.budgets, dtype=float)
    decay = (grid.min() / grid) ** 0.7  # 1 at the smallest budget, decreasing
    sens = rng.gamma(2.0, 1.0, size=(L, F, 1, 1))
    affinity = rng.uniform(0.3, 1.5, size=(L, F, P, 1))
    jitter = rng.normal(0.0, 0.05, size=(L, F, P, G))
    dppl = sens * affinity * decay[None, None, None, :] * (1.0 + jitter)
    cosine = 1.0 - 0.3 * np.tanh(dppl / 2.0) + rng.normal(0.0, 0.01, size=dppl.shape)
    cosine = np.clip(cosine, -1.0, 1.0)
    mask = rng.random(dppl.shape) < missing if missing > 0 else np.zeros(dppl.shape, dtype=bool)
    table._entropy[...] = rng.uniform(0.2, 0.95, size=(L, F))
    table._variance[...] = rng.uniform(1e-4, 1e-2, size=(L, F))
    table.full_ppl = float(rng.uniform(10.0, 30.0))
    kl = np.maximum(dppl, 0.0) / 20.0 * rng.uniform(0.8, 1.2, size=dppl.shape)
    if samples is not None:
        per = {
            "dppl": dppl[..., None]
            + rng.normal(0.0, 1.0, size=(*dppl.shape, samples)) * noise * (1.0 + dppl[..., None]),
            "cosine": np.clip(cosine[..., None] + rng.normal(0.0, 0.01, size=(*dppl.shape, samples)), -1.0, 1.0),
            "kl": kl[..., None] * rng.gamma(4.0, 0.25, size=(*dppl.shape, samples)),
        }
        dppl, cosine, kl = per["dppl"].mean(-1), per["cosine"].mean(-1), per["kl"].mean(-1)
        ddof = 1 if samples > 1 else 0
        for name, values in per.items():
            se = values.std(axis=-1, ddof=ddof) / np.sqrt(samples) if samples > 1 else np.full(dppl.shape, np.nan)
            se[mask] = np.nan
            values[mask] = np.nan
            table._se[name][...] = se
        table._per_sample = per
        table.se_dof = samples - 1 if samples > 1 else None
    for arr in (dppl, cosine, kl):
        arr[mask] = np.nan
    table._dppl[...] = dppl
    table._cosine[...] = cosine
    table._kl[...] = kl
    return table


__all__ = ["random_signal_table"]
