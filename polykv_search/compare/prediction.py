"""Do the signals predict anything? Rank agreement between predicted degradation and measured scores.

For every budget of a comparison, the entries' predicted degradation (from a signal table; supplied by
the caller as a function of the entry's strategy) is rank-correlated (Spearman's ρ) with what the
score run measured: each suite's score (expected ρ < 0: more predicted degradation, lower score) and
each suite's KL(FullKV ‖ entry) fidelity (expected ρ > 0). The interval is a seeded percentile
bootstrap over the entries (:func:`scipy.stats.bootstrap`, paired: an entry keeps its two values).
FullKV and entries the table cannot predict are left out; fewer than :data:`MIN_ENTRIES` give no ρ.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _stats

from polykv_search.compare.model import Comparison, Row
from polykv_search.stats import _RNG_KW

#: Entries needed for a rank correlation with an interval.
MIN_ENTRIES = 4


@dataclass(frozen=True)
class RankAgreement:
    """Spearman's ρ between predicted degradation and one measure, at one budget."""

    budget: float | None
    measure: str  # a suite ("broad") or "kl:<suite>"
    entries: tuple[str, ...]
    rho: float | None
    low: float | None
    high: float | None
    level: float

    @property
    def expected_sign(self) -> int:
        """+1 when more degradation should mean a larger measure (KL), -1 for scores."""
        return 1 if self.measure.startswith("kl:") else -1

    @property
    def agrees(self) -> bool:
        """The interval excludes 0 on the expected side: the signals rank the entries as measured."""
        if self.low is None or self.high is None:
            return False
        return self.low > 0 if self.expected_sign > 0 else self.high < 0

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "measure": self.measure,
            "n": len(self.entries),
            "entries": list(self.entries),
            "spearman": self.rho,
            "interval": None if self.low is None else [self.low, self.high],
            "level": self.level,
            "expected_sign": self.expected_sign,
            "agrees": self.agrees,
        }


def spearman_interval(
    predicted: Sequence[float], measured: Sequence[float], *, level: float = 0.95, resamples: int = 9999, seed: int = 0
) -> tuple[float | None, float | None, float | None]:
    """``(rho, low, high)``: Spearman's ρ and its percentile bootstrap interval over the pairs.

    Resamples whose values are all tied have no ρ and are skipped. None everywhere with fewer than
    :data:`MIN_ENTRIES` pairs or when either side is constant."""
    x, y = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"{len(x)} predictions for {len(y)} measurements")
    if len(x) < MIN_ENTRIES or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None, None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tied resamples: ρ undefined (NaN), skipped below
        rho = float(_stats.spearmanr(x, y).statistic)
        result = _stats.bootstrap(
            (x, y),
            lambda a, b: _stats.spearmanr(a, b).statistic,
            paired=True,
            vectorized=False,
            n_resamples=resamples,
            method="percentile",
            confidence_level=level,
            **{_RNG_KW: np.random.default_rng(seed)},
        )
    dist = np.asarray(result.bootstrap_distribution, dtype=float)
    dist = dist[np.isfinite(dist)]
    if not dist.size:
        return rho, None, None
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(dist, [tail, 100 - tail])
    return rho, float(low), float(high)


def prediction_agreement(
    comparison: Comparison,
    predict: Callable[[dict[str, Any]], float | None],
    *,
    level: float = 0.95,
    resamples: int = 9999,
    seed: int = 0,
) -> list[RankAgreement]:
    """Per budget and measure, the rank agreement of ``predict(row.strategy)`` with the measured values."""
    out = []
    for budget in comparison.budgets:
        rows = [r for r in comparison.rows if r.budget == budget and not r.is_full and r.strategy is not None]
        scored = [(r, predict(r.strategy)) for r in rows]
        scored = [(r, p) for r, p in scored if p is not None and math.isfinite(p)]
        measures = sorted({s for r, _ in scored for s in r.suites}) + sorted(
            {f"kl:{s}" for r, _ in scored for s in r.kl}
        )
        for measure in measures:
            pairs = [(r.name, p, v) for r, p in scored if (v := _measured(r, measure)) is not None]
            rho, low, high = spearman_interval(
                [p for _, p, _ in pairs], [v for *_, v in pairs], level=level, resamples=resamples, seed=seed
            )
            out.append(RankAgreement(budget, measure, tuple(n for n, *_ in pairs), rho, low, high, level))
    return out


def describe(agreement: RankAgreement) -> str:
    """One line: ``B=128 broad: ρ = -0.52 [-0.85, -0.01], n=15, expected < 0: agrees``."""
    where = f"B={agreement.budget:g} " if agreement.budget is not None else ""
    n = len(agreement.entries)
    if agreement.rho is None:
        return f"{where}{agreement.measure}: no rank correlation (n={n}, or constant values)"
    interval = "" if agreement.low is None else f" [{agreement.low:+.2f}, {agreement.high:+.2f}]"
    side = "> 0" if agreement.expected_sign > 0 else "< 0"
    verdict = "agrees" if agreement.agrees else "not resolved"
    return f"{where}{agreement.measure}: ρ = {agreement.rho:+.2f}{interval}, n={n}, expected {side}: {verdict}"


def _measured(row: Row, measure: str) -> float | None:
    if measure.startswith("kl:"):
        iv = row.kl.get(measure[3:])
        value = None if iv is None else iv.estimate
    else:
        value = row.suites.get(measure)
    return value if value is not None and math.isfinite(value) else None
