"""Paired, stratified bootstrap intervals for scores, differences and gap recovered.

Every entry of a ``polykv-search score`` run sees the same samples, so comparisons are *paired*:
a resample draws sample indices once per task and uses them for every entry being compared. A
suite score is the unweighted mean of its task scores, so resampling is *stratified*: the samples
of each task are resampled within that task, independently of the other tasks (a task never
borrows samples from another one).

All intervals come from :func:`scipy.stats.bootstrap` with

* ``method="BCa"`` (bias-corrected and accelerated), falling back to ``"percentile"`` when BCa
  gives a non-finite bound (it needs a jackknife with some spread; heavily tied 0/100 scores can
  defeat it);
* :data:`RESAMPLES` resamples (scipy's default, 9999) and a 95 % level unless told otherwise;
* a seeded generator: the same seed gives the same interval, and intervals computed with the same
  seed on the same samples use the same resamples (common random numbers).

Degenerate data have defined answers, never NaN:

* a task with a single sample gives no information about spread: the interval is unbounded
  (``low = -inf``, ``high = inf``, method ``"too-few-samples"``), so such a difference is never
  called resolved;
* when every resample gives the same value (constant data, identical entries, a difference that
  is the same on every sample), the interval is the point ``[estimate, estimate]`` with method
  ``"degenerate"``.

Gap recovered ``(S_e - S_u) / (S_f - S_u)`` (docs/design.md §2) is resampled jointly from the three
entries' per-sample scores. It is *undefined* (``None`` with the reason) when FullKV minus the
best uniform baseline is not clearly positive: its paired interval must lie above 0. Resampled
ratios are clipped to ``±GAP_CLIP`` so the rare resample whose denominator is ~0 stays finite; a
bound at the clip means "unbounded".
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as _stats

LEVEL = 0.95
RESAMPLES = 9999
METHOD = "BCa"
#: resampled gap-recovered ratios are clipped to this magnitude (1000 %)
GAP_CLIP = 10.0

_BATCH = 1000  # resamples per vectorized call: bounds memory at ~batch * samples * series floats
_RNG_KW = "rng" if "rng" in inspect.signature(_stats.bootstrap).parameters else "random_state"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap confidence interval.

    Attributes
    ----------
    estimate : float
        The statistic on the original samples.
    low, high : float
        Interval bounds; ``-inf`` / ``inf`` when the data cannot bound it (a single sample).
    level : float
        Confidence level, e.g. 0.95.
    method : str
        ``"BCa"``, ``"percentile"`` (BCa fallback or requested), ``"degenerate"`` (every resample
        equal) or ``"too-few-samples"``.
    n : int
        Samples per series (summed over tasks).
    """

    estimate: float
    low: float
    high: float
    level: float = LEVEL
    method: str = METHOD
    n: int = 0

    @property
    def half_width(self) -> float:
        """Half the interval's width (``inf`` when unbounded)."""
        return (self.high - self.low) / 2.0

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of 0 (a resolved difference)."""
        return self.low > 0.0 or self.high < 0.0

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. ×100 for percent); ``factor`` > 0."""
        return Interval(self.estimate * factor, self.low * factor, self.high * factor, self.level, self.method, self.n)

    def to_json(self) -> dict[str, Any]:
        """JSON-safe: unbounded sides are ``null``."""
        fin = lambda v: float(v) if math.isfinite(v) else None  # noqa: E731
        return {
            "estimate": float(self.estimate),
            "low": fin(self.low),
            "high": fin(self.high),
            "half_width": fin(self.half_width),
            "level": self.level,
            "method": self.method,
            "n": self.n,
            "excludes_zero": self.excludes_zero,
        }


@dataclass(frozen=True)
class Gap:
    """Gap recovered with its interval, or why it is undefined.

    Attributes
    ----------
    interval : Interval or None
        The ratio with its interval; None when undefined.
    reason : str or None
        Why it is undefined (None when defined).
    denominator : Interval or None
        The interval of the ratio's denominator (FullKV − best uniform for scores, the best
        uniform's KL for fidelity), when it could be computed.
    """

    interval: Interval | None
    reason: str | None = None
    denominator: Interval | None = None

    @property
    def defined(self) -> bool:
        return self.interval is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "interval": None if self.interval is None else self.interval.to_json(),
            "reason": self.reason,
            "denominator": None if self.denominator is None else self.denominator.to_json(),
        }


# ============================================================================ public intervals
def mean_interval(values: ArrayLike, **options: Any) -> Interval:
    """Interval of the mean of per-sample values (a task score).

    Parameters
    ----------
    values : array_like, 1-D
        Per-sample values.
    **options
        ``level``, ``resamples``, ``seed``, ``method`` (see :func:`stratified_mean_interval`).
    """
    return stratified_mean_interval([values], **options)


def stratified_mean_interval(
    strata: Sequence[ArrayLike],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
    method: str = METHOD,
) -> Interval:
    """Interval of the unweighted mean of per-stratum means (a suite score over its tasks).

    Each stratum (task) is resampled within itself, independently of the others.

    Parameters
    ----------
    strata : sequence of 1-D array_like
        Per-sample values of each task.
    level : float
        Confidence level in (0, 1).
    resamples : int
        Bootstrap resamples.
    seed : int
        Seed of the resampling generator.
    method : {"BCa", "percentile"}
        Interval method; BCa falls back to percentile when it cannot give finite bounds.
    """
    series = [_as_series([s]) for s in strata]
    return bootstrap_interval(series, lambda m: m[0], level=level, resamples=resamples, seed=seed, method=method)


def paired_difference_interval(a: Sequence[ArrayLike], b: Sequence[ArrayLike], **options: Any) -> Interval:
    """Interval of ``mean_of_means(a) - mean_of_means(b)`` for two entries scored on the same samples.

    Parameters
    ----------
    a, b : sequence of 1-D array_like
        Per-sample values of each task, in the same sample order for both entries (pairing).
    **options
        As :func:`stratified_mean_interval`.
    """
    series = [_as_series([x, y]) for x, y in _zip_strata(a, b)]
    return bootstrap_interval(series, lambda m: m[0] - m[1], **options)


def gap_recovered_interval(
    entry: Sequence[ArrayLike] | None,
    best_uniform: Sequence[ArrayLike] | None,
    full: Sequence[ArrayLike] | None,
    *,
    denominator: Interval | None = None,
    **options: Any,
) -> Gap:
    """Gap recovered ``(S_e - S_u) / (S_f - S_u)`` with an interval, the three entries resampled jointly.

    Parameters
    ----------
    entry, best_uniform, full : sequence of 1-D array_like or None
        Per-sample scores of each task (same tasks, same sample order); None when missing.
    denominator : Interval, optional
        The paired interval of FullKV − best uniform when already computed with the same options
        (several entries share one reference).
    **options
        As :func:`stratified_mean_interval`.

    Returns
    -------
    Gap
        Undefined when a score is missing, or when ``S_f - S_u`` is not clearly positive (its
        paired interval does not lie above 0).
    """
    missing = [
        n for n, v in (("the entry", entry), ("the best uniform baseline", best_uniform), ("FullKV", full)) if v is None
    ]
    if missing:
        return Gap(None, f"no per-sample scores for {' and '.join(missing)}")
    if denominator is None:
        denominator = paired_difference_interval(full, best_uniform, **options)
    if not denominator.low > 0.0:
        return Gap(None, f"FullKV − best uniform is not clearly positive ({_describe(denominator)})", denominator)
    strata = [_as_series([e, u, f]) for e, u, f in _zip_strata(entry, best_uniform, full)]
    return Gap(bootstrap_interval(strata, _gap_ratio, **options), None, denominator)


def kl_gap_interval(
    entry: Sequence[ArrayLike] | None,
    best_uniform: Sequence[ArrayLike] | None,
    *,
    denominator: Interval | None = None,
    **options: Any,
) -> Gap:
    """Gap recovered on fidelity, ``(KL_u - KL_e) / KL_u``, with an interval (paired, stratified).

    Undefined when a KL is missing or the best uniform's KL is not clearly positive (its interval
    does not lie above 0: there is no divergence to recover). ``denominator``: the best uniform's
    KL interval when already computed with the same options.
    """
    missing = [n for n, v in (("the entry", entry), ("the best uniform baseline", best_uniform)) if v is None]
    if missing:
        return Gap(None, f"no per-sample KL for {' and '.join(missing)}")
    if denominator is None:
        denominator = stratified_mean_interval(best_uniform, **options)
    if not denominator.low > 0.0:
        return Gap(None, f"the best uniform's KL is not clearly positive ({_describe(denominator)})", denominator)
    strata = [_as_series([u, e]) for u, e in _zip_strata(best_uniform, entry)]
    return Gap(bootstrap_interval(strata, _kl_ratio, **options), None, denominator)


# ==================================================================================== engine
def bootstrap_interval(
    strata: Sequence[np.ndarray],
    combine: Callable[[np.ndarray], np.ndarray],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
    method: str = METHOD,
) -> Interval:
    """Stratified, paired bootstrap of ``combine(mean over strata of per-stratum means)``.

    Parameters
    ----------
    strata : sequence of ndarray, each of shape (k, n_t)
        Row i holds series i (an entry) on the n_t samples of stratum t; the columns of one
        stratum are resampled together (pairing across series), strata independently.
    combine : callable
        Maps the array of series means, shape (k, ...), to the statistic, shape (...).
    level, resamples, seed, method
        As :func:`stratified_mean_interval`.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if method not in ("BCa", "percentile"):
        raise ValueError(f"method must be 'BCa' or 'percentile', got {method!r}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not strata:
        raise ValueError("no samples")
    k = strata[0].shape[0]
    if any(s.ndim != 2 or s.shape[0] != k for s in strata):
        raise ValueError("every stratum must hold the same series")

    def statistic(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        means = np.mean([np.mean(s, axis=axis) for s in samples], axis=0)
        return combine(means)

    estimate = float(statistic(*strata))
    n = int(sum(s.shape[1] for s in strata))
    if min(s.shape[1] for s in strata) < 2:
        return Interval(estimate, -math.inf, math.inf, level, "too-few-samples", n)
    kwargs = {"axis": -1, "vectorized": True, "paired": False, "confidence_level": level, "batch": _BATCH}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate-data and divide warnings: handled below
        result = _stats.bootstrap(
            tuple(strata),
            statistic,
            n_resamples=resamples,
            method=method,
            **kwargs,
            **{_RNG_KW: np.random.default_rng(seed)},
        )
        dist = result.bootstrap_distribution
        if np.ptp(dist) <= 1e-12 * max(1.0, abs(estimate)):
            return Interval(estimate, estimate, estimate, level, "degenerate", n)
        low, high = result.confidence_interval
        used = method
        if not (math.isfinite(low) and math.isfinite(high)):
            result = _stats.bootstrap(
                tuple(strata),
                statistic,
                n_resamples=0,
                method="percentile",
                bootstrap_result=result,
                **kwargs,
                **{_RNG_KW: np.random.default_rng(seed)},
            )
            low, high = result.confidence_interval
            used = "percentile"
    return Interval(estimate, float(low), float(high), level, used, n)


# =================================================================================== helpers
def _gap_ratio(m: np.ndarray) -> np.ndarray:
    return _clipped_ratio(m[0] - m[1], m[2] - m[1])


def _kl_ratio(m: np.ndarray) -> np.ndarray:
    return _clipped_ratio(m[0] - m[1], m[0])


def _clipped_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den clipped to ±GAP_CLIP; a non-positive denominator gives the clip in num's sign."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    safe = np.where(den > 0, den, 1.0)
    ratio = np.where(den > 0, num / safe, np.sign(num) * GAP_CLIP)
    return np.clip(ratio, -GAP_CLIP, GAP_CLIP)


def _as_series(rows: Sequence[ArrayLike]) -> np.ndarray:
    arrays = [np.asarray(r, dtype=float).reshape(-1) for r in rows]
    if len({a.size for a in arrays}) != 1:
        raise ValueError(f"paired series must have the same samples, got sizes {[a.size for a in arrays]}")
    if arrays[0].size == 0:
        raise ValueError("a task has no samples")
    out = np.stack(arrays)
    if not np.all(np.isfinite(out)):
        raise ValueError("per-sample values must be finite")
    return out


def _zip_strata(*groups: Sequence[ArrayLike]) -> list[tuple]:
    if len({len(g) for g in groups}) != 1:
        raise ValueError(f"every entry must have the same tasks, got {[len(g) for g in groups]}")
    if not groups[0]:
        raise ValueError("no tasks")
    return list(zip(*groups))


def _describe(iv: Interval) -> str:
    if not iv.bounded:
        return f"{iv.estimate:+.3g} : a task has a single sample"
    return f"{iv.estimate:+.3g}, {100 * iv.level:.0f}% interval [{iv.low:+.3g}, {iv.high:+.3g}]"


__all__ = [
    "GAP_CLIP",
    "LEVEL",
    "METHOD",
    "RESAMPLES",
    "Gap",
    "Interval",
    "bootstrap_interval",
    "gap_recovered_interval",
    "kl_gap_interval",
    "mean_interval",
    "paired_difference_interval",
    "stratified_mean_interval",
]
