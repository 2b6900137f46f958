"""Standard errors over samples and token blocks, and the per-sample values a collected table keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_collect import make_samples
from tiny import tiny_model

from polykv_search.runtime.view import cpu_threads
from signals.collect import collect_signals
from signals.uncertainty import block_means, block_sizes, ratio_mean_se, t_quantile


def test_blocks_cover_the_continuation_in_contiguous_near_equal_pieces():
    assert block_sizes(10, 4).tolist() == [3, 3, 2, 2]
    assert block_sizes(3, 4).tolist() == [1, 1, 1]  # never more blocks than tokens
    x = np.arange(10.0)[None]
    np.testing.assert_allclose(block_means(x, block_sizes(10, 4)), [[1.0, 4.0, 6.5, 8.5]])


def test_equal_blocks_give_the_textbook_standard_error():
    rng = np.random.default_rng(0)
    means = rng.normal(size=(5, 6))
    mu, se = ratio_mean_se(means, np.full(6, 4))
    np.testing.assert_allclose(mu, means.mean(-1))
    np.testing.assert_allclose(se, means.std(-1, ddof=1) / math.sqrt(6))


def test_unequal_blocks_give_the_ratio_estimator_standard_error():
    rng = np.random.default_rng(1)
    sizes = np.array([3, 3, 2, 2, 3])
    means = rng.normal(size=5)
    mu, se = ratio_mean_se(means, sizes)
    totals = means * sizes
    expected_mu = totals.sum() / sizes.sum()
    k = len(sizes)
    expected_se = math.sqrt(k / (k - 1) * sum((t - expected_mu * n) ** 2 for t, n in zip(totals, sizes))) / sizes.sum()
    assert mu == pytest.approx(expected_mu) and se == pytest.approx(expected_se)
    assert math.isnan(ratio_mean_se(np.array([1.0]), np.array([4]))[1])  # one unit: no spread to estimate
    assert t_quantile(0.95, 7) == pytest.approx(2.3646, abs=1e-4) and math.isnan(t_quantile(0.95, None))


@pytest.fixture(scope="module")
def collected():
    model = tiny_model("llama", layers=2)
    samples = make_samples(3, n=24, m=6, seed=2)
    kw = dict(patterns=["snapkv", "streaming_llm"], budgets=[4, 12], journal=False)
    records = []
    with cpu_threads(1):  # a module fixture: the per-test restore (conftest) runs after it
        one = collect_signals(model, samples, blocks=1, on_record=records.append, **kw)
        return one, collect_signals(model, samples, blocks=3, **kw), records


def test_with_one_block_per_sample_the_standard_error_is_over_samples(collected):
    table, _, _ = collected
    assert table.n_samples == 3 and table.se_dof == 2
    for name in ("cosine", "kl"):
        per = table.per_sample_array(name)
        np.testing.assert_allclose(table.signal_array(name), per.mean(-1), atol=1e-12)
        np.testing.assert_allclose(table.se_array(name), per.std(-1, ddof=1) / math.sqrt(3), atol=1e-12)
    assert (table.per_sample_array("kl") >= 0).all()


def test_dppl_is_the_pooled_difference_and_its_se_the_delta_method(collected):
    table, _, records = collected
    full = {r["sample"]: r["nll"] for r in records if r["kind"] == "full"}
    assert table.full_ppl == pytest.approx(math.exp(np.mean(list(full.values()))))
    for r in (r for r in records if r["kind"] == "unit" and r["sample"] == 0):
        cells = [u for u in records if u["kind"] == "unit" and (u["layer"], u["phase"]) == (r["layer"], r["phase"])]
        nll = np.array([[c[0] for c in u["nll"]] for u in sorted(cells, key=lambda u: u["sample"])])  # [S, cells]
        diff = nll - np.array([full[s] for s in range(3)])[:, None]
        cell_ppl = np.exp(nll.mean(0))
        f = table.phase_index(r["phase"])
        got_dppl = table.dppl_array()[r["layer"], f].reshape(-1)
        got_se = table.se_array("dppl")[r["layer"], f].reshape(-1)
        np.testing.assert_allclose(got_dppl, cell_ppl - table.full_ppl, rtol=1e-9)
        np.testing.assert_allclose(got_se, cell_ppl * diff.std(0, ddof=1) / math.sqrt(3), rtol=1e-9)
        per = table.per_sample_array("dppl")[r["layer"], f].reshape(-1, 3).T
        np.testing.assert_allclose(per, np.exp(nll) - np.exp([[full[s]] for s in range(3)]), rtol=1e-9)


def test_token_blocks_add_units_and_keep_the_values(collected):
    one, three, _ = collected
    assert three.se_dof == 3 * 3 - 1
    for name in ("cosine", "dppl", "kl"):
        np.testing.assert_allclose(one.signal_array(name), three.signal_array(name), atol=1e-9)
        np.testing.assert_allclose(one.per_sample_array(name), three.per_sample_array(name), atol=1e-9)
    assert not np.allclose(one.se_array("kl"), three.se_array("kl"))
