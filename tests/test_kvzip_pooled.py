"""kvzip's pooled allocations (``allocation="layer"`` / ``"model"``, KVzip's own rule): the tokens of many
KV heads ranked at once, heads of different lengths, the pool's total held through decoding."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import make_pattern
from polykv_search.patterns.selection import keep_per_head, select_keep
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.runtime.layer import EvictingLayer, PhasePlan
from polykv_search.runtime.layouts import HeadGroupPlan, head_group_layer
from polykv_search.runtime.report import layer_report
from polykv_search.scoring import Entry, per_entry
from polykv_search.scoring.shared import SharedScorer
from strategies import LayerChoice, Strategy
from tests.oracle import Oracle
from tests.test_eval_support import char_tokenizer
from tests.test_runtime import batch, run_three_steps
from tests.test_scoring_engines import assert_same, jobs
from tests.tiny import FAMILIES, tiny_model


def pooled(L: int, budgets, allocation: str, decoding=None) -> Strategy:
    params = {"allocation": allocation, "n_sink": 2}
    prefill = [LayerChoice("kvzip", b, params) for b in budgets]
    dec = prefill if decoding is None else decoding
    return Strategy(prefill, dec, global_budget=sum(budgets) / L, b_min=1)


def cells(cache):
    """Per layer, ``(its store, the model's KV heads it holds)``: a pooled layer is one group per KV head."""
    for layer in cache.layers:
        for store, heads in layer.cells():
            yield layer.layer_idx, store, list(range(store.positions.shape[1]) if heads is None else heads)


def held(cache):
    """Per (layer, row, KV head) the positions really held (padding slots left out)."""
    out = {}
    for idx, store, heads in cells(cache):
        for b in range(store.positions.shape[0]):
            for i, h in enumerate(heads):
                out[idx, b, h] = sorted(store.positions[b, i][store.valid[b, i]].tolist())
    return dict(sorted(out.items()))


def oracle_held(oracle, cache):
    out = {}
    for idx, b, h in held(cache):
        kept = oracle.layers[idx].kept[b, h] & oracle.layers[idx].valid[b]
        out[idx, b, h] = kept.nonzero().flatten().tolist()
    return out


def test_keep_per_head_is_each_heads_own_top_count():
    key = torch.randn(2, 3, 17, generator=torch.Generator().manual_seed(0))
    key[0, 1, 4] = key[0, 1, 9]  # a tie: the older token first
    counts = torch.tensor([[5, 0, 17], [1, 9, 3]])
    keep, kept = keep_per_head(key, counts)
    assert keep.shape == kept.shape == (2, 3, 17)
    for b in range(2):
        for h in range(3):
            c = int(counts[b, h])
            want = select_keep(key[b : b + 1, h : h + 1], None, None, c)[0, 0].tolist() if c else []
            assert keep[b, h][kept[b, h]].tolist() == want
            assert int(kept[b, h].sum()) == c and not kept[b, h, c:].any()


def run_both(family, strategy, steps):
    model = tiny_model(family, layers=3, seed=5)
    ids, mask = batch(seed=6, n=30, pad=5)  # a left-padded row
    cont = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(7))
    with apply_strategy(model, strategy):
        _, cache = run_three_steps(model, strategy, ids, mask, cont, steps=steps)
    with Oracle(model, strategy) as oracle:
        run_three_steps(model, strategy, ids, mask, cont, steps=steps)
    return held(cache), oracle_held(oracle, cache)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("allocation", ["model", "layer"])
def test_pooled_kvzip_keeps_the_oracles_tokens_through_prefill_and_decoding(family, allocation):
    budgets = [14, 18, 16]
    got, want = run_both(family, pooled(3, budgets, allocation), steps=5)
    assert got == want
    assert len({len(v) for v in got.values()}) > 1, "the heads should hold different numbers of tokens"
    for b in range(2):
        if allocation == "model":  # the pool holds exactly its total through the question and decoding
            assert sum(len(got[l, b, h]) for l in range(3) for h in range(2)) == 2 * sum(budgets)
        else:
            assert all(sum(len(got[l, b, h]) for h in range(2)) == 2 * budget for l, budget in enumerate(budgets))


def test_once_the_appended_tokens_outgrow_the_pool_every_cell_keeps_sinks_and_its_newest_share():
    """C = 2 * 31 = 62, sinks S = 12 over P = 6 cells: 9 appended tokens per cell (54 > C - S = 50) leave
    each cell its 2 sinks and its newest 50 // 6 = 8 appended tokens, whatever its layer's budget."""
    got, want = run_both("llama", pooled(3, [9, 12, 10], "model"), steps=5)
    assert got == want
    assert all(len(v) == 10 and v[2:] == list(range(31, 39)) for v in got.values())


def test_pooled_prefill_alone_matches_the_oracle_and_the_pool_spans_only_its_layers():
    """Layers 0 and 2 share a pool; layer 1 (snapkv) is outside it; decoding is per-head kvzip."""
    model = tiny_model("llama", layers=3, seed=8)
    zip_ = {"allocation": "model", "n_sink": 2}
    prefill = [LayerChoice("kvzip", 8, zip_), LayerChoice("snapkv", 12, {"window": 4}), LayerChoice("kvzip", 14, zip_)]
    decoding = [LayerChoice("kvzip", 12, {"n_sink": 2})] * 3
    strategy = Strategy(prefill, decoding, global_budget=12, b_min=1)
    ids, mask = batch(seed=9, n=28, pad=4)
    with torch.no_grad(), apply_strategy(model, strategy) as rt:
        model(ids, attention_mask=mask, use_cache=True)
        cache = rt.last_cache
        got = held(cache)
    with torch.no_grad(), Oracle(model, strategy) as oracle:
        model(ids, attention_mask=mask, use_cache=True)
    assert got == oracle_held(oracle, cache)
    for b in range(2):
        assert sum(len(got[l, b, h]) for l in (0, 2) for h in range(2)) == 2 * (8 + 14)
        assert all(len(got[1, b, h]) == 12 for h in range(2))


def test_a_pooled_allocation_without_room_to_pool_is_the_per_head_rule():
    """One KV head per pool ("layer" on a 1-KV-head model) is every head's own top-b."""
    model = tiny_model("llama", layers=2, seed=1, num_key_value_heads=1)
    ids, mask = batch(seed=2, n=24, pad=0)
    out = {}
    for allocation in ("layer", "head"):
        strategy = pooled(2, [7, 9], allocation)
        with torch.no_grad(), apply_strategy(model, strategy) as rt:
            model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
            out[allocation] = held(rt.last_cache)
    assert out["layer"] == out["head"]


def test_each_kv_head_of_a_pooled_layer_is_a_store_of_its_own_length():
    model = tiny_model("llama", layers=2, seed=3)
    strategy = pooled(2, [8, 8], "model")
    ids, _ = batch(seed=4, n=26, pad=0)
    with torch.no_grad(), apply_strategy(model, strategy) as rt:
        model(ids[:1], use_cache=True)
        report = rt.report()
        cache = rt.last_cache
    stores = [(idx, store) for idx, store, _ in cells(cache)]
    lengths = [store.length for _, store in stores]
    assert sum(lengths) == 2 * 2 * 8  # one row: L * Hkv * B tokens in all, no padding slot
    assert all(bool(store.valid.all()) for _, store in stores)
    assert len(set(lengths)) > 1
    per_token = stores[0][1].kv_bytes() // lengths[0]
    assert report.kv_bytes == per_token * sum(lengths)  # the bytes of the tokens held, nothing more
    assert report.kv_bytes == cache_report_uniform(model, ids[:1])


def cache_report_uniform(model, ids) -> int:
    with torch.no_grad(), apply_strategy(model, Strategy.uniform(2, "kvzip", 8)) as rt:
        model(ids, use_cache=True)
        return rt.report().kv_bytes


def test_a_directly_built_layer_holds_heads_of_different_lengths_as_padded_slots():
    """The same rule on one store of several KV heads (a layer built without head groups): the padding
    slots are invalid, and the report's ``kept`` counts real tokens."""
    model = tiny_model("llama", layers=1, seed=3)
    ids, _ = batch(seed=4, n=26, pad=0)
    with torch.no_grad(), apply_strategy(model, Strategy.full(1)) as rt:
        model(ids[:1], use_cache=True)
        full = rt.last_cache.layers[0]
    zipped = PhasePlan(make_pattern("kvzip", allocation="layer", n_sink=2), 8)
    layer = EvictingLayer(0, zipped, zipped, **{**rt.layer_kwargs(0), "on_update": None})
    layer.update(full.keys, full.values)
    layer.calls = 1
    state = layer._state(zipped.pattern)
    state.token["kvzip"] = torch.rand(1, 2, 26, generator=torch.Generator().manual_seed(0))
    state.token["scored"] = torch.ones(1, 2, 26)
    scores = state.token["kvzip"][0].clone()
    counts = torch.tensor([[5, 11]])
    layer.evict_per_head(zipped, counts)
    assert layer.length == 11 and layer.valid.sum(-1).tolist() == [[5, 11]]
    assert layer_report(layer).kept == 8
    for h, c in enumerate([5, 11]):
        best = sorted(range(2, 26), key=lambda j: -float(scores[h, j]))[: c - 2]  # the 2 sinks first
        assert layer.positions[0, h, :c].tolist() == sorted([0, 1, *best])
        assert layer.positions[0, h, c:].eq(-1).all()


def test_pooled_allocations_refuse_decode_intervals_and_head_groups_in_one_line():
    model = tiny_model("llama", layers=2)
    with pytest.raises(ValueError, match="decode_interval must be 1") as err:
        with apply_strategy(model, pooled(2, [8, 8], "model"), decode_interval=4):
            pass
    assert "\n" not in str(err.value)
    zipped = PhasePlan(make_pattern("kvzip", allocation="layer"), 8)
    groups = [HeadGroupPlan((0, 1), zipped, zipped)]  # single-head groups may pool; a group of two may not
    with apply_strategy(model, Strategy.full(2)) as rt:
        kw = rt.layer_kwargs(0)
    with pytest.raises(ValueError, match="pooled allocation") as err:
        head_group_layer(0, groups, **kw)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="allocation must be one of head, layer, model, got 'global'"):
        make_pattern("kvzip", allocation="global")


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_shared_engine_scores_pooled_entries_as_the_per_entry_engine(kind):
    model, tok = tiny_model("qwen3"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    es = [
        Entry("full", Strategy.full(3), "baseline", "full"),
        Entry("kvzip-model", pooled(3, [24, 20, 28], "model"), "strategy", "m"),
        Entry("kvzip-layer", pooled(3, [16, 16, 16], "layer"), "strategy", "l"),
        Entry("kvzip-head", Strategy.uniform(3, "kvzip", 20), "baseline", "kvzip"),
        Entry("snapkv", Strategy.uniform(3, "snapkv", 24), "baseline", "snapkv"),
    ]
    reference = per_entry.run_sample(model, es, job)
    with apply_strategy(model, Strategy.full(3)) as rt:
        shared = SharedScorer(model, rt, [strategy_plans(e.strategy) for e in es]).run(job)
    assert_same(reference, shared, job)


def test_keep_per_head_with_one_count_is_the_single_budget_selection():
    key = torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(1))
    for c in (8, 4, 9):  # one token out (the decoding step), several, none
        keep, kept = keep_per_head(key, torch.full((2, 3), c))
        assert torch.equal(keep, select_keep(key, None, None, c)) and bool(kept.all())


def test_a_share_whose_rows_moved_counts_alone_as_its_pool_did():
    from polykv_search.runtime.pooled import Pool, PoolShare

    g = torch.Generator().manual_seed(2)
    ranks = torch.randperm(2 * 5 * 7, generator=g).view(2, 5, 7)
    protected = torch.tensor([10, 9])
    pool = Pool(ranks, 40, protected, seen=30)
    shares = [PoolShare(ranks[:, i : i + 1], 40, 5, protected, 30, pool, i) for i in range(5)]
    for seen in (30, 31, 34, 38):  # no appended token, a few, and more than the pool holds
        pooled = [share.counts(seen) for share in shares]
        for share in shares:
            share.map_rows(lambda t: t)  # rows moved (here: in place): the share computes alone
        assert all(torch.equal(a, share.counts(seen)) for a, share in zip(pooled, shares))
        for i, share in enumerate(shares):
            share.pool, share.first = pool, i
