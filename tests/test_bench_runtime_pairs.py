"""``benchmarks/bench_runtime.py --paired-to``: every other pattern's configuration is paired with the
same ``k`` and mode of the named pattern, and each ratio is taken within a repeat (the arithmetic; the
benchmark itself is not run here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import benchmark_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def scripts():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))  # bench_runtime imports its sibling as a script does
        yield benchmark_script("bench_runtime"), benchmark_script("runtime_pairs")


def test_each_pattern_is_paired_with_the_same_interval_and_mode_of_the_named_one(scripts):
    bench, rp = scripts
    patterns = ["snapkv", "expected_attention", "keydiff"]
    names = [c[0] for c in bench.configurations(30, patterns, 256, [1, 8])]
    pairing = rp.pairs(patterns, 256, [1, 8], "snapkv")
    assert pairing == {
        "expected_attention B256 k1": "snapkv B256 k1",
        "expected_attention B256 k8 within": "snapkv B256 k8 within",
        "expected_attention B256 k8 over": "snapkv B256 k8 over",
        "keydiff B256 k1": "snapkv B256 k1",
        "keydiff B256 k8 within": "snapkv B256 k8 within",
        "keydiff B256 k8 over": "snapkv B256 k8 over",
    }
    assert set(pairing) | set(pairing.values()) <= set(names)


def test_a_pattern_spec_runs_that_pattern_with_its_parameters(scripts):
    bench, rp = scripts
    patterns = ["snapkv", "kvzip[allocation=model]"]
    configs = {c[0]: c[1] for c in bench.configurations(30, patterns, 256, [1])}
    pooled = configs["kvzip[allocation=model] B256 k1"].prefill[7]
    assert (pooled.pattern, dict(pooled.params), pooled.budget) == ("kvzip", {"allocation": "model"}, 256)
    assert rp.pairs(patterns, 256, [1], "snapkv") == {"kvzip[allocation=model] B256 k1": "snapkv B256 k1"}


def test_a_pattern_not_measured_cannot_be_the_pair(scripts):
    _, rp = scripts
    with pytest.raises(ValueError, match="'h2o' is not one of --pattern snapkv,tova"):
        rp.pairs(["snapkv", "tova"], 256, [1], "h2o")


def test_ratios_are_taken_within_each_repeat_and_summarized_by_their_median(scripts):
    _, rp = scripts
    base = [{"decode_tok_s": v, "prefill_s": 2.0} for v in (20.0, 10.0, 18.0, 16.0, 12.0)]
    runs = [{"decode_tok_s": v, "prefill_s": 3.0} for v in (18.0, 9.5, 15.0, 15.2, 10.8)]
    got = rp.paired({"a": runs, "b": base}, {"a": "b"})["a"]
    ratios = [0.9, 0.95, 15.0 / 18.0, 0.95, 0.9]
    assert got["vs"] == "b"
    np.testing.assert_allclose(got["decode"]["ratios"], ratios)
    assert got["decode"]["median"] == pytest.approx(float(np.median(ratios)))
    assert min(ratios) <= got["decode"]["low"] <= got["decode"]["median"] <= got["decode"]["high"] <= max(ratios)
    assert got["prefill"]["median"] == pytest.approx(1.5) and got["prefill"]["low"] == pytest.approx(1.5)
    assert rp.text(got["prefill"]) == "1.500 [1.500, 1.500]"


def test_below_three_repeats_only_the_median_is_given(scripts):
    _, rp = scripts
    got = rp.median_ratio([9.0, 8.0], [10.0, 10.0])
    assert got["median"] == pytest.approx(0.85) and got["low"] is None and got["high"] is None
    assert rp.text(got) == "0.850"
