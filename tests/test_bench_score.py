"""``benchmarks/bench_score.py``: the engines' speed-up as a share of the ceiling measured beside them, sample
by sample (the arithmetic in the default run; one tiny run on SmolLM2 with ``pytest -m slow``)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import benchmark_script


@pytest.fixture(scope="module")
def bench():
    return benchmark_script("bench_score")


PARTS = [  # two samples' ceiling times (seconds), as ceiling_sample returns them
    {"per_entry_s": 12.0, "shared_s": 2.0, "real_per_entry_s": 14.0, "real_shared_s": 3.0},
    {"per_entry_s": 24.0, "shared_s": 4.0, "real_per_entry_s": 26.0, "real_shared_s": 5.0},
]


def test_the_ceiling_over_samples_is_the_ratio_of_summed_times(bench):
    bound = bench.ceiling_report(PARTS, budget=64, n_full=1)
    assert (bound["per_entry_s"], bound["shared_s"], bound["ratio"]) == (36.0, 6.0, 6.0)
    assert bound["real_lengths"] == {"full_entries": 1, "per_entry_s": 40.0, "shared_s": 8.0, "ratio": 5.0}
    assert "real_lengths" not in bench.ceiling_report([{"per_entry_s": 1.0, "shared_s": 1.0}], 64, 0)


def test_shares_divide_the_speed_up_by_each_ceiling_and_show_each_engine_over_its_own_side(bench):
    bound = bench.ceiling_report(PARTS, budget=64, n_full=1)
    s = bench.shares(per_entry_s=60.0, shared_s=15.0, bound=bound)  # a 4x speed-up
    assert s["share_of_ceiling"] == pytest.approx({"budget-length": 4 / 6, "real_lengths": 4 / 5})
    # per-entry 60 s over its one-row side 40 s; shared 15 s over its batched side 8 s
    assert s["over_ceiling_time"] == pytest.approx({"per-entry": 1.5, "shared": 15 / 8})
    # the share is exactly the ratio of the two engines' overheads over their own sides
    over = s["over_ceiling_time"]
    assert s["share_of_ceiling"]["real_lengths"] == pytest.approx(over["per-entry"] / over["shared"])


@pytest.fixture(scope="module")
def cstats():
    return benchmark_script("ceiling_stats")


def test_a_ratio_of_sums_has_a_paired_bootstrap_interval_around_it(cstats):
    shared, ceiling = [12.0, 30.0, 21.0, 40.0, 16.0, 25.0], [10.0, 25.0, 15.0, 30.0, 14.0, 20.0]
    over = cstats.paired_interval(cstats.ratio_of_sums, shared, ceiling)
    assert over["value"] == pytest.approx(144 / 114) and over["units"] == 6
    assert over["low"] < over["value"] < over["high"]
    # every unit's own ratio lies in [1.14, 1.4]: so does any resample's ratio of sums
    assert 1.14 <= over["low"] and over["high"] <= 1.4
    # units that all take 1.2x the ceiling leave no doubt
    fixed = cstats.paired_interval(cstats.ratio_of_sums, [1.2 * c for c in ceiling], ceiling)
    assert fixed["low"] == pytest.approx(1.2) and fixed["high"] == pytest.approx(1.2)


def test_the_share_interval_is_the_speed_up_over_the_ceilings_speed_up(cstats):
    cols = ([60.0, 30.0, 45.0], [15.0, 10.0, 12.0], [40.0, 20.0, 30.0], [8.0, 4.0, 6.0])
    share = cstats.paired_interval(cstats.share_of_sums, *cols)
    assert share["value"] == pytest.approx((135 / 37) / (90 / 18))
    assert share["low"] <= share["value"] <= share["high"]


@pytest.mark.parametrize(
    ("low", "high", "word"), [(1.1, 1.2, "met, resolved"), (1.3, 1.5, "not met, resolved"), (1.2, 1.3, "not resolved")]
)
def test_the_80_percent_target_is_resolved_only_by_the_whole_interval(cstats, low, high, word):
    assert cstats.verdict({"value": (low + high) / 2, "low": low, "high": high}).endswith(word)
    assert "not resolved" in cstats.verdict({"value": 1.0, "low": None, "high": None})


def test_unit_intervals_pair_each_samples_engine_times_with_its_ceiling(bench):
    units = [({"shared": s, "per-entry": p}, c) for s, p, c in zip([15.0, 30.0, 20.0], [60.0, 100.0, 90.0], PARTS * 2)]
    iv = bench.unit_intervals(units, n_full=1)["intervals"]
    assert iv["shared_over_ceiling"]["value"] == pytest.approx(65 / (3 + 5 + 3))
    assert iv["share_of_ceiling"]["value"] == pytest.approx((250 / 65) / ((14 + 26 + 14) / 11))
    assert iv["target"].endswith("not met, resolved")  # 5x, 6x and 6.7x the ceiling's batched side


@pytest.mark.slow
def test_a_two_round_run_interleaves_per_sample_and_totals_its_rounds(bench, tmp_path):
    out = tmp_path / "b.json"
    argv = ["--contexts", "128", "--budget", "32", "--suite", "broad/continuation", "--h2o-repeats", "0"]
    assert bench.main([*argv, "--rounds", "2", "--out", str(out)]) == 0
    ctx = json.loads(out.read_text())["contexts"]["128"]
    assert ctx["scores_identical"] is True
    assert [len(ctx["runs"][e]) for e in ("shared", "per-entry")] == [2, 2] and len(ctx["rounds"]) == 2
    wall = {e: sum(r["wall_s"] for r in ctx["runs"][e]) for e in ("shared", "per-entry")}
    assert ctx["speedup_wall"] == pytest.approx(wall["per-entry"] / wall["shared"])
    assert ctx["share_of_ceiling"]["budget-length"] == pytest.approx(ctx["speedup_wall"] / ctx["ceiling"]["ratio"])
    assert ctx["ceiling"]["real_lengths"]["full_entries"] == 1
    assert ctx["intervals"]["shared_over_ceiling"]["units"] == 2  # one sample, two rounds


@pytest.mark.slow
def test_shared_only_times_the_engine_beside_the_ceilings_batched_calls(bench, tmp_path):
    out = tmp_path / "s.json"
    argv = ["--contexts", "128", "--budget", "32", "--suite", "broad/continuation", "--shared-only"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    ctx = json.loads(out.read_text())["contexts"]["128"]
    (run,) = ctx["runs"]["shared"]
    assert "per-entry" not in ctx["runs"] and ctx["ceiling_shared_s"] > 0
    assert ctx["over_ceiling"] == pytest.approx(run["wall_s"] / ctx["ceiling_shared_s"])
    assert ctx["over_ceiling_interval"]["value"] == pytest.approx(ctx["over_ceiling"])
