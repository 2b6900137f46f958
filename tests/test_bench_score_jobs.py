"""``benchmarks/bench_score_jobs.py``: the shared engine beside its ceiling in the layout of ``score --jobs N``
(the pooling in the default run; a two-worker run on SmolLM2 with ``pytest -m slow``)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import benchmark_script


@pytest.fixture(scope="module")
def bench():
    return benchmark_script("bench_score_jobs")


def test_the_workers_samples_are_pooled_into_one_ratio_of_summed_times(bench):
    units = [
        {"task": "a", "shard": 0, "engine_s": 12.0, "ceiling_s": 10.0},
        {"task": "b", "shard": 1, "engine_s": 30.0, "ceiling_s": 25.0},
        {"task": "a", "shard": 0, "engine_s": 21.0, "ceiling_s": 15.0},
        {"task": "b", "shard": 1, "engine_s": 40.0, "ceiling_s": 30.0},
    ]
    out = bench.pooled(units)
    assert (out["engine_s"], out["ceiling_s"]) == (103.0, 80.0)
    over = out["over_ceiling_interval"]
    assert over["value"] == pytest.approx(103 / 80) and over["units"] == 4
    assert 1.2 <= over["low"] <= over["value"] <= over["high"] <= 1.4  # every unit's own ratio is in [1.2, 1.4]
    assert out["target"].endswith("not resolved")  # the interval straddles 1.25x


def test_bad_counts_are_refused_with_a_usage_error(bench):
    with pytest.raises(SystemExit) as e:
        bench.main(["--jobs", "0"])
    assert e.value.code == 2


@pytest.mark.slow
def test_two_workers_share_the_samples_and_time_each_beside_its_ceiling(bench, tmp_path):
    out = tmp_path / "j.json"
    argv = ["--contexts", "128", "--samples", "2", "--budget", "32", "--suite", "broad/continuation", "--jobs", "2"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["jobs"] == 2 and report["threads_per_worker"] >= 1
    ctx = report["contexts"]["128"]
    assert ctx["samples"] == 2 and sorted(u["shard"] for u in ctx["units"]) == [0, 1]
    assert all(u["engine_s"] > 0 and u["ceiling_s"] > 0 for u in ctx["units"])
    assert ctx["over_ceiling_interval"]["value"] == pytest.approx(ctx["engine_s"] / ctx["ceiling_s"])
