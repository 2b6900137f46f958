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


@pytest.mark.slow
def test_shared_only_times_the_engine_beside_the_ceilings_batched_calls(bench, tmp_path):
    out = tmp_path / "s.json"
    argv = ["--contexts", "128", "--budget", "32", "--suite", "broad/continuation", "--shared-only"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    ctx = json.loads(out.read_text())["contexts"]["128"]
    (run,) = ctx["runs"]["shared"]
    assert "per-entry" not in ctx["runs"] and ctx["ceiling_shared_s"] > 0
    assert ctx["over_ceiling"] == pytest.approx(run["wall_s"] / ctx["ceiling_shared_s"])
