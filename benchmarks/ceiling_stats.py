"""Intervals for ``bench_score.py``'s shares: a paired bootstrap over the timed units (sample x round).

One machine's speed drifts by tens of percent between runs minutes apart, so a share measured once is a
point estimate. Each unit is one sample's engine run(s) and the ceiling's calls right after it; resampling
the units (all of a unit's times together; :func:`polykv_search.stats.bootstrap_interval`) gives the
interval of a ratio of summed times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from polykv_search.stats import LEVEL, bootstrap_interval

#: issue 29's target: the shared engine at >= 80 % of the ceiling, i.e. at most 1.25x the ceiling's batched time
TARGET_OVER = 1.25


def paired_interval(combine: Callable[[np.ndarray], np.ndarray], *columns: Sequence[float]) -> dict:
    """``combine`` of the columns' means (every column has one time per unit) with its 95 % paired
    bootstrap interval over the units; ``low``/``high`` are None when the units cannot bound it."""
    iv = bootstrap_interval([np.asarray(columns, dtype=float)], combine)
    bounded = math.isfinite(iv.low) and math.isfinite(iv.high)
    return {
        "value": iv.estimate,
        "low": iv.low if bounded else None,
        "high": iv.high if bounded else None,
        "units": iv.n,
        "confidence": LEVEL,
    }


def ratio_of_sums(means: np.ndarray) -> np.ndarray:
    """``sum(num) / sum(den)`` from the two columns' means (the same units)."""
    return means[0] / means[1]


def share_of_sums(means: np.ndarray) -> np.ndarray:
    """The engines' speed-up over the ceiling's, ``(sum(per_entry) / sum(shared)) / (sum(c_pe) / sum(c_sh))``,
    from the four columns' means."""
    return (means[0] / means[1]) / (means[2] / means[3])


def verdict(over: dict, target: float = TARGET_OVER) -> str:
    """Whether the engine's time over the ceiling's batched side meets ``target`` (at most): resolved
    either way only when the whole interval lies on one side."""
    if over["low"] is None:
        return "not resolved (too few units for an interval)"
    if over["high"] <= target:
        return f"target (<= {target}x) met, resolved"
    if over["low"] > target:
        return f"target (<= {target}x) not met, resolved"
    return f"target (<= {target}x) not resolved"


def interval_text(x: dict, unit: str = "x") -> str:
    if x["low"] is None:
        return f"{x['value']:.3f}{unit}"
    return f"{x['value']:.3f}{unit} [{x['low']:.3f}, {x['high']:.3f}] ({x['units']} units)"
