"""`polykv-search collect`: replay equals the naive per-cell forward, resume, refusal, parallel, entropy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny import tiny_model

from polykv_search.data import Sample
from polykv_search.runtime.view import cpu_threads
from signals import SignalTable
from signals.collect import CollectError, collect_signals
from signals.journal import journal_path

ALL_PATTERNS = ["snapkv", "tova", "h2o", "streaming_llm", "knorm", "random", "keydiff", "expected_attention", "kvzip"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is fastest (and immune to a loaded machine)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_samples(count=2, n=32, m=5, seed=0, vocab=128):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        ids = torch.randint(1, vocab, (n + m,), generator=g).tolist()
        out.append(Sample(context_ids=ids[:n], continuation_ids=ids[n:], doc_id=f"d{i}", offset=0))
    return out


def assert_tables_close(a: SignalTable, b: SignalTable, tol=1e-4):
    assert (a.phases, a.patterns, a.budgets) == (b.phases, b.patterns, b.budgets)
    np.testing.assert_allclose(a.cosine_array(), b.cosine_array(), atol=tol, rtol=0)
    # ΔPPL is a difference of perplexities (~130 on a random 128-token vocabulary): relative tolerance
    scale = max(a.full_ppl, 1.0)
    np.testing.assert_allclose(a.dppl_array(), b.dppl_array(), atol=tol * scale, rtol=0)
    np.testing.assert_allclose(a.full_ppl, b.full_ppl, rtol=tol)
    np.testing.assert_allclose(a.entropy_array(), b.entropy_array(), atol=tol)
    np.testing.assert_allclose(a.variance_array(), b.variance_array(), atol=tol)
    np.testing.assert_allclose(a.kl_array(), b.kl_array(), atol=tol)
    assert a.se_dof == b.se_dof and a.n_samples == b.n_samples
    for name, atol in (("cosine", tol), ("dppl", tol * scale), ("kl", tol)):
        np.testing.assert_allclose(a.se_array(name), b.se_array(name), atol=atol, rtol=0)
        np.testing.assert_allclose(a.per_sample_array(name), b.per_sample_array(name), atol=atol, rtol=0)


# --------------------------------------------------------------------------- replay == naive
def test_replay_equals_naive_on_every_pattern():
    model = tiny_model("llama", layers=3)
    samples = make_samples(2, n=28, m=4)
    kw = dict(patterns=ALL_PATTERNS, budgets=[6, 20], layers=[0, 2], journal=False)
    fast = collect_signals(model, samples, **kw)
    slow = collect_signals(model, samples, naive=True, **kw)
    assert_tables_close(fast, slow)
    # evicting a layer changes something, and the values are sane
    cos = fast.cosine_array()[[0, 2]]
    assert (cos <= 1 + 1e-9).all() and (cos < 1 - 1e-6).any()
    kl = fast.kl_array()[[0, 2]]
    assert (kl >= 0).all() and (kl > 1e-6).any()  # KL(FullKV || cell): non-negative, and evictions cost some
    assert fast.se_dof == 2 * 4 - 1 and np.isfinite(fast.se_array("kl")[[0, 2]]).all()
    ent = fast.entropy_array()
    assert ((ent > 0) & (ent <= 1)).all()
    assert (fast.variance_array() >= 0).all()
    assert fast.provenance["method"] == "replay" and slow.provenance["method"] == "naive"


def test_replay_of_kvzip_plus_cells_equals_naive():
    """The replay's reconstruction pass (once per sample) hands KVzip+ its inputs as each cell's own runtime does."""
    model = tiny_model("llama", layers=3)
    samples = make_samples(2, n=28, m=4)
    kw = dict(patterns=["kvzip[plus=true]", "kvzip"], budgets=[6, 20], layers=[0, 2], journal=False)
    fast = collect_signals(model, samples, **kw)
    assert_tables_close(fast, collect_signals(model, samples, naive=True, **kw))
    kl = fast.kl_array()[[0, 2]]
    plus, plain = (list(fast.patterns).index(p) for p in ("kvzip[plus=true]", "kvzip"))
    assert not np.allclose(kl[:, :, plus], kl[:, :, plain])  # the weights change what the cells keep


@pytest.mark.parametrize("family", ["qwen3", "mistral", "qwen2"])
def test_replay_equals_naive_on_other_families(family):
    model = tiny_model(family, layers=2)
    samples = make_samples(1, n=24, m=4, seed=1)
    kw = dict(patterns=["snapkv", "h2o", "tova", "random", "expected_attention"], budgets=[5, 16], journal=False)
    assert_tables_close(collect_signals(model, samples, **kw), collect_signals(model, samples, naive=True, **kw))


def test_keep_all_budget_is_lossless_and_layers_subset_leaves_the_rest_missing():
    model = tiny_model("llama", layers=3)
    samples = make_samples(1, n=16, m=4)
    table = collect_signals(model, samples, patterns=["knorm"], budgets=[8, 64], layers=[1], journal=False)
    cos, dppl = table.cosine_array(), table.dppl_array()
    np.testing.assert_allclose(cos[1, :, :, 1], 1.0, atol=1e-6)  # budget 64 > 16+4 tokens: nothing evicted
    np.testing.assert_allclose(dppl[1, :, :, 1], 0.0, atol=1e-3)
    np.testing.assert_allclose(table.kl_array()[1, :, :, 1], 0.0, atol=1e-6)
    assert table.indistinguishable("dppl")[1, :, :, 1].all()  # the lossless cell cannot be told from FullKV
    assert np.isnan(cos[[0, 2]]).all() and not np.isnan(cos[1]).any()
    assert np.isfinite(table.entropy_array()).all()  # entropy is collected for every layer
    assert table.provenance["layers"] == [1]


# --------------------------------------------------------------------------- resume
class Boom(Exception):
    pass


def test_interrupted_collection_resumes_to_the_same_table(tmp_path):
    model = tiny_model("llama", layers=3)
    samples = make_samples(2, n=24, m=4)
    kw = dict(patterns=["snapkv", "tova", "random"], budgets=[4, 10])
    reference = collect_signals(model, samples, journal=False, **kw)

    out = tmp_path / "signals.json"
    seen = []

    def interrupt_after_5(rec):
        seen.append(rec)
        if sum(r["kind"] == "unit" for r in seen) == 5:
            raise Boom

    with pytest.raises(Boom):
        collect_signals(model, samples, out=out, on_record=interrupt_after_5, **kw)
    assert not out.exists()  # no half-written output
    lines = journal_path(out).read_text().splitlines()
    assert len(lines) == 1 + 1 + 5  # header, sample 0's FullKV record, 5 units

    again = []
    table = collect_signals(model, samples, out=out, on_record=again.append, **kw)
    units_total = 2 * 3 * 2
    assert sum(r["kind"] == "unit" for r in again) == units_total - 5  # nothing finished is recomputed
    assert [r["sample"] for r in again if r["kind"] == "full"] == [1]
    assert table.digest() == reference.digest()  # the same values as an uninterrupted run
    assert SignalTable.load(out).digest() == reference.digest()
    assert not journal_path(out).exists()  # cleaned up once the table is written
    assert table.provenance["timings"]["resumed"] is True


def test_torn_last_journal_line_is_dropped(tmp_path):
    model = tiny_model("llama", layers=2)
    samples = make_samples(1, n=16, m=3)
    kw = dict(patterns=["tova"], budgets=[4])
    out = tmp_path / "s.json"
    reference = collect_signals(model, samples, journal=False, **kw)

    def stop(rec):
        if rec["kind"] == "unit":
            raise Boom

    with pytest.raises(Boom):
        collect_signals(model, samples, out=out, on_record=stop, **kw)
    with open(journal_path(out), "a") as fh:
        fh.write('{"kind": "unit", "sample": 0, "lay')  # a crash mid-write
    assert collect_signals(model, samples, out=out, **kw).digest() == reference.digest()


def test_changed_model_grid_or_calibration_is_refused(tmp_path):
    model = tiny_model("llama", layers=2)
    samples = make_samples(1, n=16, m=3)
    kw = dict(patterns=["tova", "knorm"], budgets=[4, 8])
    out = tmp_path / "s.json"

    def stop(rec):
        if rec["kind"] == "unit":
            raise Boom

    with pytest.raises(Boom):
        collect_signals(model, samples, out=out, on_record=stop, **kw)
    with pytest.raises(CollectError, match="different budgets"):
        collect_signals(model, samples, out=out, patterns=["tova", "knorm"], budgets=[4, 16])
    with pytest.raises(CollectError, match="different calibration set"):
        collect_signals(model, make_samples(1, n=16, m=3, seed=7), out=out, **kw)
    with pytest.raises(CollectError, match="different model"):
        collect_signals(tiny_model("llama", layers=3), samples, out=out, **kw)
    with pytest.raises(CollectError, match=r"method \(--naive\)"):
        collect_signals(model, samples, out=out, naive=True, **kw)
    # one line each, and --fresh starts over
    table = collect_signals(model, samples, out=out, fresh=True, patterns=["tova"], budgets=[4])
    assert table.is_complete()


def test_bad_input_is_a_one_line_error():
    model = tiny_model("llama", layers=2)
    samples = make_samples(1, n=16, m=3)
    for kw, match in [
        (dict(patterns=["nope"]), "unknown pattern 'nope'; known:"),
        (dict(budgets=[0, 4]), "budgets"),
        (dict(phases=["training"]), "phases"),
        (dict(layers="7"), "out of range"),
        (dict(jobs=0), "jobs"),
    ]:
        with pytest.raises(CollectError, match=match) as info:
            collect_signals(model, samples, journal=False, **kw)
        assert "\n" not in str(info.value)
    with pytest.raises(CollectError, match="continuation"):
        collect_signals(model, make_samples(1, n=16, m=1), journal=False)


# --------------------------------------------------------------------------- parallel
def test_jobs_split_units_into_tasks_and_give_the_same_table(tmp_path):
    """The task path of ``jobs > 1`` (split, worker-side model, journaling), run in-process."""
    model = tiny_model("llama", layers=2)
    samples = make_samples(2, n=20, m=4)
    kw = dict(patterns=["snapkv", "h2o"], budgets=[4, 8])
    serial = collect_signals(model, samples, journal=False, **kw)
    records = []
    tasked = collect_signals(
        model, samples, out=tmp_path / "p.json", jobs=2, backend="sequential", on_record=records.append, **kw
    )
    assert tasked.digest() == serial.digest()
    assert sorted(r["sample"] for r in records if r["kind"] == "full") == [0, 1]  # once per sample
    assert sum(r["kind"] == "unit" for r in records) == 2 * 2 * 2


@pytest.mark.slow
def test_jobs_fan_out_to_local_processes(tmp_path):
    model = tiny_model("llama", layers=2)
    samples = make_samples(2, n=20, m=4)
    kw = dict(patterns=["snapkv", "h2o"], budgets=[4, 8])
    serial = collect_signals(model, samples, journal=False, **kw)
    parallel = collect_signals(model, samples, out=tmp_path / "p.json", jobs=2, **kw)
    assert_tables_close(serial, parallel, tol=1e-6)
    assert parallel.provenance["timings"]["jobs"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["dask", "ray"])
def test_cluster_backends_with_a_local_cluster(backend, tmp_path):
    if backend == "dask":
        pytest.importorskip("dask.distributed")
    else:
        pytest.importorskip("ray")
    model = tiny_model("llama", layers=2)
    samples = make_samples(1, n=16, m=3)
    kw = dict(patterns=["tova"], budgets=[4])
    serial = collect_signals(model, samples, journal=False, **kw)
    remote = collect_signals(model, samples, journal=False, jobs=2, backend=backend, **kw)
    assert_tables_close(serial, remote, tol=1e-6)


# --------------------------------------------------------------------------- entropy
def test_entropy_of_uniform_attention_is_one():
    from polykv_search.patterns import make_pattern
    from polykv_search.runtime import EvictingLayer, PhasePlan
    from signals.entropy import attention_entropy, attention_variance

    full = PhasePlan(make_pattern("full"), None)
    layer = EvictingLayer(0, full, full, num_kv_heads=2, groups=2, scaling=0.25)
    layer.update(torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16))
    queries = torch.zeros(1, 4, 10, 16)  # zero queries: uniform over the visible keys
    assert attention_entropy(layer, queries, torch.arange(10)) == pytest.approx(1.0, abs=1e-6)
    last = torch.zeros(1, 4, 3, 16)
    # the last 3 queries see 8, 9, 10 keys uniformly: per-key variance over queries is known exactly
    probs = torch.tensor([[1 / 8] * 8 + [0, 0], [1 / 9] * 9 + [0], [1 / 10] * 10], dtype=torch.float64)
    expected = float(probs.var(dim=0, unbiased=False).sum())
    assert attention_variance(layer, last, torch.arange(7, 10)) == pytest.approx(expected, rel=1e-6)


# --------------------------------------------------------------------------- SmolLM2
@pytest.mark.slow
def test_replay_equals_naive_on_smollm2():
    from polykv_search.data import load_corpus
    from polykv_search.data import make_samples as cut
    from polykv_search.models import load_model

    model, tokenizer = load_model()
    samples = cut(tokenizer, load_corpus("austen"), n_samples=1, context_len=160, continuation_len=6, seed=0)
    kw = dict(patterns=["snapkv", "h2o", "random"], budgets=[32, 96], layers=[0, 29], journal=False)
    with cpu_threads(2):
        fast = collect_signals(model, samples, **kw)
        slow = collect_signals(model, samples, naive=True, **kw)
    assert_tables_close(fast, slow)
    assert math.isfinite(fast.full_ppl) and fast.full_ppl < 200
