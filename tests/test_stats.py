"""stats: seeded, stratified, paired bootstrap intervals — known answers on hand-made per-sample data."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import stats as scipy_stats

from polykv_search import stats


def exact_bootstrap(strata: list[list[float]], statistic) -> np.ndarray:
    """Every equally likely stratified resample (all index tuples of every task), brute force."""
    per_stratum = [list(itertools.product(s, repeat=len(s))) for s in strata]
    return np.array([statistic([np.mean(r) for r in combo]) for combo in itertools.product(*per_stratum)])


def assert_between_quantiles(value: float, dist: np.ndarray, q: float, slack: float = 0.012) -> None:
    lo, hi = np.quantile(dist, [max(0.0, q - slack), min(1.0, q + slack)])
    assert lo - 1e-9 <= value <= hi + 1e-9, (value, lo, hi)


# ------------------------------------------------------------------------------ known answers
def test_percentile_interval_of_a_mean_matches_the_exact_bootstrap_distribution():
    data = [0.0, 10.0, 40.0, 100.0]  # 4**4 = 256 equally likely resamples
    exact = exact_bootstrap([data], lambda means: means[0])
    iv = stats.mean_interval(data, method="percentile", resamples=20000, seed=1)
    assert iv.estimate == pytest.approx(37.5) and iv.method == "percentile"
    assert_between_quantiles(iv.low, exact, 0.025)
    assert_between_quantiles(iv.high, exact, 0.975)


def test_suite_interval_resamples_each_task_within_itself():
    ruler, broad = [0.0, 100.0, 100.0], [20.0, 40.0, 90.0]  # 27 x 27 stratified resamples
    exact = exact_bootstrap([ruler, broad], lambda means: np.mean(means))
    iv = stats.stratified_mean_interval([ruler, broad], method="percentile", resamples=20000, seed=2)
    assert iv.estimate == pytest.approx((200 / 3 + 50) / 2)
    assert_between_quantiles(iv.low, exact, 0.025)
    assert_between_quantiles(iv.high, exact, 0.975)


def test_suite_score_is_the_unweighted_mean_of_task_means_not_the_pooled_mean():
    iv = stats.stratified_mean_interval([[100.0, 100.0], [0.0] * 6])
    assert iv.estimate == pytest.approx(50.0)  # pooled would be 25
    assert iv.n == 8


def test_bca_is_the_default_and_close_to_percentile_on_smooth_data():
    data = np.random.default_rng(0).normal(50, 10, 40)
    bca = stats.mean_interval(data)
    pct = stats.mean_interval(data, method="percentile")
    assert bca.method == "BCa" and bca.level == 0.95
    assert bca.low < data.mean() < bca.high
    assert bca.low == pytest.approx(pct.low, abs=1.0) and bca.high == pytest.approx(pct.high, abs=1.0)
    # the normal-theory interval is a sanity bound: same width within 20 %
    se = data.std(ddof=1) / math.sqrt(len(data))
    assert 2 * bca.half_width == pytest.approx(2 * 1.96 * se, rel=0.2)


def test_level_changes_the_width():
    data = np.random.default_rng(3).normal(0, 1, 30)
    assert stats.mean_interval(data, level=0.8).half_width < stats.mean_interval(data, level=0.99).half_width


# ---------------------------------------------------------------------------------- pairing
def test_paired_difference_is_resolved_when_one_entry_is_better_on_every_sample():
    rng = np.random.default_rng(4)
    a = rng.uniform(0, 100, 30)  # very different samples ...
    b = a + 2.0 + rng.normal(0, 0.5, 30)  # ... b is ~2 points better on each of them
    d = stats.paired_difference_interval([b], [a])
    assert d.excludes_zero and d.low > 0 and d.estimate == pytest.approx(np.mean(b - a))
    # unpaired, the two scores' own intervals overlap widely: only pairing resolves the difference
    ia, ib = stats.mean_interval(a), stats.mean_interval(b)
    assert ia.high > ib.low


def test_paired_difference_of_equivalent_entries_is_not_resolved():
    rng = np.random.default_rng(5)
    a = rng.uniform(0, 100, 40)
    b = a + rng.normal(0, 5, 40)
    b -= np.mean(b - a)  # same mean score, different per-sample
    d = stats.paired_difference_interval([a], [b])
    assert d.estimate == pytest.approx(0.0, abs=1e-9)
    assert d.low < 0 < d.high and not d.excludes_zero


def test_paired_difference_is_stratified_by_task():
    a = [[100.0, 0.0, 100.0], [50.0, 60.0]]
    b = [[0.0, 0.0, 100.0], [50.0, 50.0]]
    d = stats.paired_difference_interval(a, b)
    assert d.estimate == pytest.approx((100 / 3 + 5) / 2)
    exact = exact_bootstrap([[100.0, 0.0, 0.0], [0.0, 10.0]], lambda means: np.mean(means))
    pct = stats.paired_difference_interval(a, b, method="percentile", resamples=20000)
    assert_between_quantiles(pct.low, exact, 0.025, slack=0.02)
    assert_between_quantiles(pct.high, exact, 0.975, slack=0.02)


def test_paired_series_must_have_the_same_samples():
    with pytest.raises(ValueError, match="same samples"):
        stats.paired_difference_interval([[1.0, 2.0]], [[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="same tasks"):
        stats.paired_difference_interval([[1.0, 2.0]], [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ValueError, match="finite"):
        stats.mean_interval([1.0, math.nan])


# ------------------------------------------------------------------------------- degenerate
def test_constant_data_give_a_point_interval():
    iv = stats.mean_interval([70.0] * 8)
    assert (iv.estimate, iv.low, iv.high, iv.half_width, iv.method) == (70.0, 70.0, 70.0, 0.0, "degenerate")
    same = stats.paired_difference_interval([[0.0, 100.0, 50.0]], [[0.0, 100.0, 50.0]])
    assert (same.low, same.high) == (0.0, 0.0) and not same.excludes_zero
    shifted = stats.paired_difference_interval([[5.0, 105.0, 55.0]], [[0.0, 100.0, 50.0]])
    assert (shifted.low, shifted.high) == pytest.approx((5.0, 5.0)) and shifted.excludes_zero


def test_a_single_sample_gives_an_unbounded_interval_never_a_resolved_one():
    iv = stats.mean_interval([100.0])
    assert iv.method == "too-few-samples" and iv.low == -math.inf and iv.high == math.inf
    assert not iv.bounded and iv.half_width == math.inf
    d = stats.paired_difference_interval([[100.0], [40.0, 60.0]], [[0.0], [40.0, 50.0]])
    assert d.estimate == pytest.approx((100 + 5) / 2) and not d.excludes_zero
    assert iv.to_json() == {
        "estimate": 100.0,
        "low": None,
        "high": None,
        "half_width": None,
        "level": 0.95,
        "method": "too-few-samples",
        "n": 1,
        "excludes_zero": False,
    }


def test_bca_falls_back_to_percentile_when_it_has_no_finite_bound():
    # every leave-one-out statistic is equal (zero acceleration over zero): scipy's BCa gives NaN
    data = np.array([0.0, 100.0, 0.0, 100.0])
    band = lambda m: ((m > 30) & (m < 70)).astype(float)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = scipy_stats.bootstrap((data,), lambda x, axis=-1: band(x.mean(axis=axis)), rng=0)
    assert math.isnan(raw.confidence_interval.low)
    iv = stats.bootstrap_interval([data[None, :]], lambda m: band(m[0]))
    assert iv.method == "percentile" and (iv.low, iv.high) == (0.0, 1.0)


@pytest.mark.parametrize("data", [[0.0, 100.0], [0.0, 0.0, 100.0], [0.0] * 19 + [100.0], [6.25, 6.25, 12.5]])
def test_tiny_and_tied_data_give_finite_intervals_containing_the_estimate(data):
    iv = stats.mean_interval(data)
    assert iv.bounded and iv.low <= iv.estimate <= iv.high
    assert min(data) <= iv.low and iv.high <= max(data)


# ------------------------------------------------------------------------------ determinism
def test_the_seed_fixes_the_interval():
    data = np.random.default_rng(6).uniform(0, 100, 25)
    assert stats.mean_interval(data, seed=7) == stats.mean_interval(data, seed=7)
    assert stats.mean_interval(data, seed=7) != stats.mean_interval(data, seed=8)
    with pytest.raises(ValueError):
        stats.mean_interval(data, level=1.0)
    with pytest.raises(ValueError):
        stats.mean_interval(data, method="normal")


# ---------------------------------------------------------------------------- gap recovered
def _triple(n: int = 30, seed: int = 9):
    rng = np.random.default_rng(seed)
    u = rng.uniform(20, 60, n)
    f = u + rng.uniform(20, 40, n)
    return u, f, rng


def test_gap_recovered_known_answer_when_every_sample_recovers_half():
    u, f, _ = _triple()
    e = u + 0.5 * (f - u)
    g = stats.gap_recovered_interval([e], [u], [f])
    assert g.defined and g.reason is None
    assert (g.interval.estimate, g.interval.low, g.interval.high) == pytest.approx((0.5, 0.5, 0.5))
    assert g.denominator.low > 0


def test_gap_recovered_estimate_is_the_ratio_of_mean_differences():
    u, f, rng = _triple()
    e = u + rng.uniform(0, 1, len(u)) * (f - u)
    g = stats.gap_recovered_interval([e[:15], e[15:]], [u[:15], u[15:]], [f[:15], f[15:]])
    S = lambda x: (np.mean(x[:15]) + np.mean(x[15:])) / 2  # noqa: E731
    assert g.interval.estimate == pytest.approx((S(e) - S(u)) / (S(f) - S(u)))
    assert g.interval.low < g.interval.estimate < g.interval.high
    assert 0.0 < g.interval.low and g.interval.high < 1.0


def test_gap_recovered_is_undefined_without_a_clear_gap():
    u, f, rng = _triple()
    tie = stats.gap_recovered_interval([f], [u], [u])
    assert tie.interval is None and "not clearly positive" in tie.reason
    beaten = stats.gap_recovered_interval([f], [f], [u])  # uniform beats FullKV
    assert beaten.interval is None and beaten.denominator.high < 0
    noisy_f = u + rng.normal(0, 10, len(u))  # FullKV ~ best uniform: the gap is noise
    noisy_f += np.mean(u) - np.mean(noisy_f) + 0.5
    noisy = stats.gap_recovered_interval([u], [u], [noisy_f])
    assert noisy.interval is None and noisy.denominator.estimate == pytest.approx(0.5)
    one = stats.gap_recovered_interval([[50.0]], [[0.0]], [[100.0]])  # one sample: nothing is clear
    assert one.interval is None and "single sample" in one.reason


def test_gap_recovered_is_undefined_when_scores_are_missing():
    g = stats.gap_recovered_interval([[1.0, 2.0]], None, None)
    assert g.interval is None and g.reason == "no per-sample scores for the best uniform baseline and FullKV"
    assert g.to_json() == {"interval": None, "reason": g.reason, "denominator": None}


def test_gap_resamples_stay_finite_when_the_denominator_is_small():
    rng = np.random.default_rng(10)
    u = rng.uniform(0, 100, 40)
    f = u + 1.0 + rng.normal(0, 1.2, 40)  # clearly positive on the whole, ~0 in some resamples
    e = u + rng.normal(0, 30, 40)
    g = stats.gap_recovered_interval([e], [u], [f])
    assert g.defined and math.isfinite(g.interval.low) and math.isfinite(g.interval.high)
    assert -stats.GAP_CLIP <= g.interval.low <= g.interval.high <= stats.GAP_CLIP


def test_kl_gap_recovered():
    rng = np.random.default_rng(11)
    kl_u = rng.uniform(0.2, 0.4, 30)
    kl_e = 0.4 * kl_u  # the entry removes 60 % of the divergence on every sample
    g = stats.kl_gap_interval([kl_e], [kl_u])
    assert (g.interval.estimate, g.interval.low, g.interval.high) == pytest.approx((0.6, 0.6, 0.6))
    none = stats.kl_gap_interval([kl_e], [np.zeros(30)])
    assert none.interval is None and "not clearly positive" in none.reason
    assert stats.kl_gap_interval(None, [kl_u]).reason == "no per-sample KL for the entry"
