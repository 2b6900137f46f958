"""Integer budget allocation: water-level shares within bounds and largest-remainder rounding."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from solvers.settings import SolverError


def allocate(
    total: int,
    *,
    weights: Sequence[float] | np.ndarray,
    base: Sequence[float] | np.ndarray | float = 0.0,
    lo: int,
    hi: int | None = None,
) -> np.ndarray:
    """Integer budgets ``b_l`` in ``[lo, hi]`` with ``Σ b = total`` (or ``Σ hi`` when that is less).

    The real-valued allocation is ``r_l = clip(base_l + λ·w_l, lo, hi)`` with the water level λ
    chosen so that ``Σ r = total`` (so a capped layer's excess goes to the others in proportion to
    their weights, and a layer pushed below ``lo`` is held there); then largest-remainder rounding:
    floors first, the missing units to the largest fractional parts, ties to the lower layer index.

    If every layer with a positive weight is capped, what is left is spread evenly over the
    zero-weight layers, so ``Σ b = total`` whenever ``L·hi >= total``.

    ``base=lo, weights=s`` is the paper's ``b_min + (T − L·b_min)·s/Σs``; ``base=0, weights=p`` is a
    pure proportional share; ``base=targets, weights=1`` shifts fixed targets by a common offset.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    base_arr = np.broadcast_to(np.asarray(base, dtype=np.float64), (n,)).copy()
    if n == 0:
        raise SolverError("allocate: no layers")
    if np.any(~np.isfinite(w)) or np.any(w < 0) or np.any(~np.isfinite(base_arr)):
        raise SolverError("allocate: weights must be finite and non-negative")
    if n * lo > total:
        raise SolverError(f"infeasible: {n} layers * b_min {lo} = {n * lo} exceeds the total {total}")
    hi_f = math.inf if hi is None else float(hi)
    if n * hi_f <= total:
        return np.full(n, int(hi_f), dtype=np.int64)
    if not np.any(w > 0):
        w = np.ones(n)

    def values(lam: float) -> np.ndarray:
        return np.clip(base_arr + lam * w, lo, hi_f)

    pos = w > 0
    upper_value = np.minimum(hi_f, float(total))
    lam_hi = float(np.max((upper_value - base_arr[pos]) / w[pos])) + 1.0
    lam_lo = float(np.min((lo - base_arr[pos]) / w[pos])) - 1.0
    if values(lam_lo).sum() > total:
        raise SolverError(f"infeasible: the fixed layers alone exceed the total {total}")
    if values(lam_hi).sum() <= total:
        real = values(lam_hi)
    else:
        for _ in range(200):
            mid = 0.5 * (lam_lo + lam_hi)
            if values(mid).sum() <= total:
                lam_lo = mid
            else:
                lam_hi = mid
            if lam_hi - lam_lo <= 1e-12 * max(1.0, abs(lam_hi)):
                break
        real = values(_exact_level(lam_lo, base_arr, w, lo, hi_f, total))
    if real.sum() < total - 1e-9 and np.any((real < hi_f) & (w == 0)):
        # every weighted layer is capped: the rest goes evenly to the zero-weight layers
        return allocate(total, weights=(real < hi_f).astype(np.float64), base=real, lo=lo, hi=hi)
    target = min(total, int(math.floor(real.sum() + 1e-6)))
    return round_to_total(real, target, lo, None if hi is None else int(hi))


def _exact_level(lam: float, base: np.ndarray, w: np.ndarray, lo: float, hi: float, total: int) -> float:
    """Recompute the water level in closed form from the clamped set that bisection found, so that
    exact shares (e.g. 8.5) come out exact and ties break by index, not by rounding noise."""
    raw = base + lam * w
    tol = 1e-9 * max(1.0, float(np.abs(raw).max()))
    at_lo = raw <= lo + tol
    at_hi = raw >= hi - tol
    free = ~(at_lo | at_hi) & (w > 0)
    fixed = np.where(at_lo, lo, np.where(at_hi, hi, base + lam * w))
    if not free.any():
        return lam
    rest = total - fixed[~free].sum()
    exact = (rest - base[free].sum()) / w[free].sum()
    check = np.clip(base + exact * w, lo, hi)
    if abs(check.sum() - total) <= 1e-6 * max(1.0, total) and check.sum() <= total + 1e-9:
        return float(exact)
    return lam


def round_to_total(real: np.ndarray, target: int, lo: int, hi: int | None = None) -> np.ndarray:
    """Largest-remainder rounding of ``real`` (within ``[lo, hi]``) to integers summing to ``target``."""
    real = np.asarray(real, dtype=np.float64)
    hi_v = np.inf if hi is None else hi
    out = np.clip(np.floor(real + 1e-9), lo, hi_v).astype(np.int64)
    frac = real - out
    deficit = int(target - out.sum())
    frac = np.round(frac, 9)  # rounding noise must not decide a tie; ties go to the lower index
    order_up = sorted(range(real.size), key=lambda i: (-frac[i], i))
    order_down = sorted(range(real.size), key=lambda i: (frac[i], i))
    while deficit > 0:
        moved = False
        for i in order_up:
            if deficit == 0:
                break
            if out[i] + 1 <= hi_v:
                out[i] += 1
                deficit -= 1
                moved = True
        if not moved:
            break
    while deficit < 0:
        moved = False
        for i in order_down:
            if deficit == 0:
                break
            if out[i] - 1 >= lo:
                out[i] -= 1
                deficit += 1
                moved = True
        if not moved:
            raise SolverError(f"infeasible: cannot reach a total of {target} with every layer >= {lo}")
    return out
