"""The verdict that opens quickstart's report: sentences generated from synthetic results whose
resolved and unresolved differences are known, and the sample-size formula checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from polykv_search import compare as cmp
from polykv_search.cli.quickstart_report import NO_VERDICT, verdict_sentences
from polykv_search.compare.verdict import samples_to_resolve, verdict

V2 = Path(__file__).parent / "fixtures" / "results_v2.json"
KEEP = ("full", "uniform-h2o", "uniform-snapkv", "ilp-B64", "cake-B64")
N = 12
Z = 1.959963984540054 + 0.8416212335729143  # z_0.975 + z_0.8


def synthetic(values: dict[str, dict[str, tuple[list[float], list[float] | None]]]) -> dict:
    """The v2 fixture reduced to KEEP, with each entry's per-sample (scores, KL) per task replaced."""
    doc = json.loads(V2.read_text())
    doc["entries"] = [e for e in doc["entries"] if e["name"] in KEEP]
    for e in doc["entries"]:
        for task, (scores, kl) in values[e["name"]].items():
            rows = e["tasks"][task]["per_sample"]
            for i, row in enumerate(rows):
                row["score"] = scores[i]
                if kl is not None:
                    row["kl"] = kl[i]
            e["tasks"][task]["score"] = e["scores"][task] = float(np.mean(scores))
            if kl is not None:
                e["extra"][task]["kl"] = e["tasks"][task]["extra"]["kl"] = float(np.mean(kl))
        for suite in ("broad", "ruler"):
            e["suites"][suite] = float(np.mean([v for t, v in e["scores"].items() if t.startswith(suite)]))
    return doc


def series(base: float, step: float = 0.0, seed: int = 0, noise: float = 0.0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(base + step * (i % 3) + noise * rng.standard_normal()) for i in range(N)]


def values(ilp_broad_shift: float, cake_ruler: float) -> dict:
    """FullKV far above both uniforms; h2o the best uniform on both suites and the lowest KL;
    ilp's KL clearly below h2o's, its broad score ``ilp_broad_shift`` above h2o's (with noise);
    cake at ``cake_ruler`` on ruler."""
    base = {
        "broad/continuation": (series(40, 5), series(0.2, 0.01)),
        "broad/manyshot": (series(50, 10), None),
        "ruler/niah_single": (series(30, 10), None),
        "ruler/vt": (series(20, 10), None),
    }
    out = {
        "full": {t: ([s + 40 for s in sc], None if kl is None else [0.0] * N) for t, (sc, kl) in base.items()},
        "uniform-h2o": base,
        "uniform-snapkv": {
            t: ([s - 5 for s in sc], None if kl is None else [k + 0.1 for k in kl]) for t, (sc, kl) in base.items()
        },
        "ilp-B64": {
            t: (
                [s + ilp_broad_shift + n for s, n in zip(sc, series(0, noise=30, seed=i), strict=True)]
                if t.startswith("broad")
                else sc,
                None if kl is None else [k * 0.8 for k in kl],
            )
            for i, (t, (sc, kl)) in enumerate(base.items())
        },
        "cake-B64": {
            t: (sc if t.startswith("broad") else [s + cake_ruler for s in sc], kl) for t, (sc, kl) in base.items()
        },
    }
    return out


@pytest.fixture(scope="module")
def mixed() -> cmp.Comparison:
    return cmp.compare([synthetic(values(ilp_broad_shift=2.0, cake_ruler=-10.0))], resamples=999)


def test_the_verdict_names_resolved_gains_and_losses_with_their_intervals(mixed):
    sentences = verdict(mixed)
    assert 3 <= len(sentences) <= 6
    first = sentences[0]
    assert first.startswith("At B = 64, resolved better than the best uniform:")
    ilp_kl = next(r for r in mixed.rows if r.name == "ilp-B64").kl_gap["broad"].interval
    assert ilp_kl.excludes_zero and math.isclose(ilp_kl.estimate, 0.2, abs_tol=1e-9)
    assert (
        f"ilp-B64 on broad KL (20 % [{100 * ilp_kl.low:.0f}, {100 * ilp_kl.high:.0f}] lower than uniform-h2o's)"
        in first
    )
    assert "cake-B64" not in first
    worse = sentences[1]
    assert worse.startswith("Resolved worse: cake-B64 on ruler score (-10.0 [-10.0, -10.0] points vs uniform-h2o)")


def test_unresolved_comparisons_say_how_many_samples_would_likely_resolve_them(mixed):
    sentence = next(s for s in verdict(mixed) if "not resolved" in s)
    ilp = next(r for r in mixed.rows if r.name == "ilp-B64")
    h2o = next(r for r in mixed.rows if r.name == "uniform-h2o")
    assert not ilp.diff["broad"].excludes_zero  # the noisy +2 on broad score stays open at 12 samples
    tasks = ["broad/continuation", "broad/manyshot"]
    d = [np.asarray(ilp.samples[t].score) - np.asarray(h2o.samples[t].score) for t in tasks]
    delta = np.mean([x.mean() for x in d])
    expected = math.ceil(Z**2 * sum(x.var(ddof=1) for x in d) / 4 / delta**2)
    assert f"ilp-B64 on broad score ({ilp.diff['broad'].estimate:+.1f}" in sentence
    assert f"about {expected:,} samples per task to resolve (now {N};" in sentence
    assert "paired mean difference" in sentence and "80 % power" in sentence
    assert "on ruler score" not in sentence  # ilp ties h2o there sample by sample: nothing to resolve


def test_the_verdict_states_the_gap_to_recover_and_the_memory_held(mixed):
    text = " ".join(verdict(mixed))
    assert "FullKV is resolved above the best uniform on broad +40.0 [+40.0, +40.0] over uniform-h2o" in text
    assert "The strategies hold 12.1–12.5 % of FullKV's KV cache" in text and "saving 88 % or more" in text


def test_with_nothing_resolved_the_verdict_says_so_plainly():
    doc = synthetic(values(ilp_broad_shift=0.5, cake_ruler=0.0))
    for e in doc["entries"]:
        if e["name"] == "ilp-B64":  # ilp's KL back to h2o's, with noise: nothing resolved
            kl = series(0.2, 0.01)
            noisy = [k + n for k, n in zip(kl, series(0, noise=0.02, seed=7), strict=True)]
            for row, k in zip(e["tasks"]["broad/continuation"]["per_sample"], noisy, strict=True):
                row["kl"] = k
            e["extra"]["broad/continuation"]["kl"] = float(np.mean(noisy))
    c = cmp.compare([doc], resamples=999)
    sentences = verdict(c)
    assert sentences[0] == "At B = 64, no strategy is resolved better than the best uniform on any measure."
    assert not any(s.startswith("Resolved worse") for s in sentences)


def test_samples_to_resolve_is_the_paired_normal_approximation_by_hand():
    # one task, differences 1, 2, 3, 4: mean 2.5, variance 5/3 -> ceil(Z² · (5/3) / 6.25)
    assert samples_to_resolve([[1, 2, 3, 4]], [[0, 0, 0, 0]]) == math.ceil(Z**2 * (5 / 3) / 6.25)
    # two tasks: the suite mean's variance is Σ σ_t² / T², its difference the mean of the task means
    a, b = [[1, 2, 3, 4], [0, 0, 2, 2]], [[0, 0, 0, 0], [0, 0, 0, 0]]
    var = (5 / 3 + 4 / 3) / 4
    assert samples_to_resolve(a, b) == math.ceil(Z**2 * var / 1.75**2)
    assert samples_to_resolve([[1, 1]], [[1, 1]]) is None  # no difference: nothing to resolve
    assert samples_to_resolve([[1]], [[0]]) is None  # one sample: no variance
    assert samples_to_resolve([[5, 5, 5]], [[0, 0, 0]]) == 2  # constant difference: resolved at once


def test_without_per_sample_scores_the_report_says_there_is_no_verdict():
    doc = synthetic(values(ilp_broad_shift=2.0, cake_ruler=-10.0))
    for e in doc["entries"]:
        for task in e["tasks"].values():
            task["per_sample"] = []
    c = cmp.compare([doc], resamples=99)
    assert verdict_sentences(c) == [NO_VERDICT]


def test_a_hopeless_sample_count_is_said_as_more_than_the_cap(mixed, monkeypatch):
    from polykv_search.compare import verdict as module

    monkeypatch.setattr(module, "samples_to_resolve", lambda *a, **k: 123_456)
    sentence = next(s for s in verdict(mixed) if "not resolved" in s)
    assert f"would likely need more than {module.HOPELESS:,} samples per task" in sentence
