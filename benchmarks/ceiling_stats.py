"""Intervals for ``bench_score.py``'s shares: a paired bootstrap over the timed units (sample x round).

One machine's speed drifts by tens of percent between runs minutes apart, so a share measured once is a
point estimate. Each unit is one sample's engine run(s) and the ceiling's calls right after it; resampling
the units (all of a unit's times together) gives the interval of a ratio of summed times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

#: issue 29's target: the shared engine at >= 80 % of the ceiling, i.e. at most 1.25x the ceiling's batched time
TARGET_OVER = 1.25


def paired_interval(
    statistic: Callable[..., np.ndarray], *columns: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> dict:
    """``statistic(*columns)`` (of summed columns, vectorised over ``axis``) with a percentile bootstrap
    interval over the units (rows); ``low``/``high`` are None with fewer than 3 units."""
    data = [np.asarray(c, dtype=float) for c in columns]
    value = float(statistic(*data, axis=-1))
    n = len(data[0])
    if n < 3:
        return {"value": value, "low": None, "high": None, "units": n, "confidence": confidence}
    res = stats.bootstrap(
        data,
        statistic,
        paired=True,
        vectorized=True,
        confidence_level=confidence,
        method="percentile",
        n_resamples=9999,
        random_state=np.random.default_rng(seed),
    )
    low, high = res.confidence_interval
    return {"value": value, "low": float(low), "high": float(high), "units": n, "confidence": confidence}


def ratio_of_sums(num, den, axis=-1):
    """``sum(num) / sum(den)``."""
    return np.sum(num, axis=axis) / np.sum(den, axis=axis)


def share_of_sums(per_entry, shared, ceiling_per_entry, ceiling_shared, axis=-1):
    """The engines' speed-up over the ceiling's: ``(sum(per_entry) / sum(shared)) / (sum(c_pe) / sum(c_sh))``."""
    speedup = np.sum(per_entry, axis=axis) / np.sum(shared, axis=axis)
    return speedup / (np.sum(ceiling_per_entry, axis=axis) / np.sum(ceiling_shared, axis=axis))


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
