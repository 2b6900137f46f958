"""Standard errors of the cell signals: over samples and over token blocks of the continuation.

Every signal of a cell is a mean over the continuation tokens of all calibration samples (cosine and
KL directly; ΔPPL through the mean NLL). Tokens of one continuation are correlated, so they are not
independent draws; contiguous **blocks** of tokens are. Each sample's m continuation tokens are cut
into ``blocks`` contiguous blocks (:func:`block_sizes`, sizes as equal as possible), and the
resampling units are the ``S × blocks`` (sample, block) pairs. With unit totals ``T_k`` and sizes
``n_k`` the mean is the ratio ``μ = Σ T_k / Σ n_k`` and its standard error is the cluster-robust
(ratio-estimator) one::

    SE(μ)² = K / (K − 1) · Σ_k (T_k − μ·n_k)² / (Σ_k n_k)²          K = number of units

which is ``std(block means, ddof=1) / sqrt(K)`` when all blocks have the same size. Intervals use
Student's t with ``K − 1`` degrees of freedom (:func:`t_quantile`). ΔPPL's standard error is the
delta-method one: ``ΔPPL = exp(ν_full + Δν) − exp(ν_full)`` with ``Δν`` the paired mean NLL
difference, so ``SE(ΔPPL) = PPL(cell) · SE(Δν)`` (the FullKV term is shared by every cell and has
no variance of its own in the difference).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

#: Default number of token blocks per continuation.
DEFAULT_BLOCKS = 4


def block_sizes(m: int, blocks: int) -> np.ndarray:
    """Sizes of ``min(blocks, m)`` contiguous blocks covering ``m`` tokens (``numpy.array_split``)."""
    if m < 1 or blocks < 1:
        raise ValueError(f"need m >= 1 and blocks >= 1, got m={m}, blocks={blocks}")
    k = min(blocks, m)
    return np.array([len(a) for a in np.array_split(np.arange(m), k)], dtype=np.int64)


def block_means(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per-row block means of ``values`` ``[..., m]`` → ``[..., len(sizes)]``."""
    values = np.asarray(values, dtype=np.float64)
    edges = np.concatenate([[0], np.cumsum(sizes)])
    return np.stack([values[..., a:b].mean(axis=-1) for a, b in zip(edges[:-1], edges[1:])], axis=-1)


def ratio_mean_se(means: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and cluster-robust standard error from unit means ``[..., K]`` with unit sizes ``[K]``.

    The SE is NaN when there is a single unit (nothing to estimate a spread from).
    """
    means = np.asarray(means, dtype=np.float64)
    n = np.asarray(sizes, dtype=np.float64)
    k = means.shape[-1]
    totals = means * n
    mu = totals.sum(axis=-1) / n.sum()
    if k < 2:
        return mu, np.full(mu.shape, np.nan)
    resid = totals - mu[..., None] * n
    se = np.sqrt(k / (k - 1) * (resid**2).sum(axis=-1)) / n.sum()
    return mu, se


def t_quantile(level: float, dof: int | None) -> float:
    """Two-sided Student-t quantile for a ``level`` interval with ``dof`` degrees of freedom."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if dof is None or dof < 1:
        return math.nan
    return float(stats.t.ppf(0.5 + level / 2, dof))


__all__ = ["DEFAULT_BLOCKS", "block_means", "block_sizes", "ratio_mean_se", "t_quantile"]
