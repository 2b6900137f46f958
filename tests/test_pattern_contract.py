"""The pattern–layer contract: a pattern that overrides ``cache_update`` keeps the same tokens alone, in
the row-batched scorer and in the signal replay; the state kinds move with the cache; the eviction
rule is one function; an attention call that cannot find its cache layer fails loudly; value heads
may differ in size from key heads."""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F

from polykv_search import scoring
from polykv_search.patterns import PATTERNS, LayerView, Pattern, PatternState
from polykv_search.runtime import (
    FULL_PLAN,
    EvictingLayer,
    PhasePlan,
    PolyKVRuntime,
    apply_strategy,
    cache_report,
    eviction_target,
)
from polykv_search.runtime.layouts import row_batch, row_parts
from signals.collect import collect_signals
from strategies import Strategy
from tests.test_collect import assert_tables_close, make_samples
from tests.test_eval_support import char_tokenizer
from tests.test_row_batch import call
from tests.test_scoring_engines import assert_same, jobs, run_both
from tests.tiny import tiny_model

H, G, D = 2, 2, 4
KW = {"num_kv_heads": H, "groups": G, "scaling": 0.5}


@dataclass(frozen=True)
class KeyMass(Pattern):
    """A test pattern with its own ``cache_update``: keep the tokens whose keys' first coordinates,
    summed over every call a token has been cached through (token state), are largest."""

    name: ClassVar[str] = "test_key_mass"

    def post_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        acc = state.token.get("mass")
        acc = torch.zeros(layer.valid.shape) if acc is None else F.pad(acc, (0, layer.length - acc.shape[-1]))
        state.token["mass"] = acc + layer.keys[..., 0].float().masked_fill(~layer.valid, 0.0)  # padding: nothing

    def cache_update(self, layer: LayerView, state: PatternState, budget: int) -> torch.Tensor:
        mass = state.token["mass"].masked_fill(~layer.valid, float("-inf"))  # padding is never kept first
        return mass.topk(budget, dim=-1).indices.sort(dim=-1).values


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(PATTERNS, KeyMass.name, KeyMass)
    return KeyMass.name


def test_a_pattern_overriding_cache_update_gets_a_batched_variant_that_calls_it():
    assert KeyMass.cache_update_rows is not Pattern.cache_update_rows
    assert PATTERNS["snapkv"].cache_update_rows is Pattern.cache_update_rows  # ranks by selection_key


def _prefilled(plan: PhasePlan, decoding: PhasePlan, prompt, query, **kw) -> EvictingLayer:
    layer = EvictingLayer(0, plan, decoding, **KW, **kw)
    layer.update(*prompt)
    layer.attention_call(query, None)
    return layer


@pytest.mark.parametrize(("interval", "mode"), [(1, "within"), (3, "within"), (3, "over")])
def test_overriding_pattern_keeps_the_same_tokens_alone_and_row_batched(interval, mode):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{interval}/{mode}".encode()))
    kw = {"decode_interval": interval, "interval_mode": mode}
    n = 18
    prompt = (torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen))
    query = torch.randn(1, H * G, n, D, generator=gen)
    p = KeyMass()
    plans = [(PhasePlan(p, 12), PhasePlan(p, 12)), (PhasePlan(p, 9), PhasePlan(p, 7)), (FULL_PLAN, FULL_PLAN)]
    plans += [(PhasePlan(p, n + 4), PhasePlan(p, 15)), (PhasePlan(p, 5), PhasePlan(p, 3))]
    alone = [_prefilled(a, b, prompt, query, **kw) for a, b in plans]
    batched = copy.deepcopy(alone)
    batch = row_batch(0, batched, **KW, **kw)
    for _ in range(12):
        k, v = torch.randn(len(alone), H, 1, D, generator=gen), torch.randn(len(alone), H, 1, D, generator=gen)
        q = torch.randn(len(alone), H * G, 1, D, generator=gen)
        for r, row in enumerate(alone):
            row.update(k[r : r + 1], v[r : r + 1])
            row.attention_call(q[r : r + 1], None)
        batch.update(k, v)
        call(batch, q)
    batch.write_back()
    for got, want in zip(batched, alone):
        assert torch.equal(got.positions, want.positions) and torch.equal(got.keys, want.keys)
        assert got.num_evictions == want.num_evictions > 0 or want.plans["decoding"].budget is None
        for pattern, state in want.states.items():
            torch.testing.assert_close(got.states[pattern].token["mass"], state.token["mass"], rtol=0, atol=1e-6)


def test_overriding_pattern_scores_the_same_through_the_shared_engine(registered):
    model, tok = tiny_model("llama", layers=3), char_tokenizer()
    mixed = Strategy.from_choices(
        [(registered, 30), ("h2o", 24), (registered, 16)], [(registered, 20), (registered, 28), ("snapkv", 24)], 24.0
    )
    es = [
        scoring.Entry("full", Strategy.full(3), "baseline", "full"),
        scoring.Entry("km", Strategy.uniform(3, registered, 24), "baseline", registered),
        scoring.Entry("km-mixed", mixed, "strategy", "m"),
    ]
    for job in jobs(tok):
        reference, shared = run_both(model, es, job)
        assert_same(reference, shared, job)


def test_overriding_pattern_replays_like_the_naive_collection(registered):
    model = tiny_model("llama", layers=2)
    samples = make_samples(1, n=24, m=4, seed=2)
    kw = dict(patterns=[registered, "h2o"], budgets=[6, 14], journal=False)
    assert_tables_close(collect_signals(model, samples, **kw), collect_signals(model, samples, naive=True, **kw))


@pytest.mark.parametrize(
    ("phase", "length", "budget", "interval", "mode", "steps", "target"),
    [
        ("prefill", 30, 10, 4, "within", 0, 10),
        ("prefill", 10, 10, 1, "within", 0, None),  # at the budget: nothing to do
        ("prefill", 30, None, 1, "within", 0, None),  # keep all
        ("decoding", 11, 10, 1, "within", 1, 10),
        ("decoding", 11, 10, 4, "within", 1, 7),  # budget - k + 1: the next k - 1 steps fit
        ("decoding", 11, 3, 4, "within", 1, 1),  # a budget below the interval
        ("decoding", 12, 10, 4, "over", 2, None),  # over the budget, but k steps have not passed
        ("decoding", 13, 10, 4, "over", 4, 10),
    ],
)
def test_the_eviction_rule(phase, length, budget, interval, mode, steps, target):
    got = eviction_target(phase, length, budget, interval=interval, mode=mode, steps_since_eviction=steps)
    assert got == target


def test_pattern_state_stack_and_take_row_are_inverse_and_gather_rows_follows_the_kept_slots():
    gen = torch.Generator().manual_seed(0)
    rows = [
        PatternState(token={"a": torch.randn(1, H, c, generator=gen)}, row={"q": torch.randn(1, 3)}, shared={"p": 5})
        for c in (4, 7, 6)
    ]
    stacked = PatternState.stack(rows, [4, 7, 6])
    assert stacked.token["a"].shape == (3, H, 7) and stacked.shared == {"p": 5}
    for j, (row, c) in enumerate(zip(rows, (4, 7, 6))):
        back = stacked.take_row(j, c)
        assert torch.equal(back.token["a"], row.token["a"]) and torch.equal(back.row["q"], row.row["q"])
    keep = torch.tensor([[[0, 2, 3], [1, 2, 5]]])  # row 1 keeps 3 of its 7 slots
    kept = torch.ones(1, 1, 3, dtype=torch.bool)
    before = stacked.copy()
    stacked.gather_rows([1], keep, kept, 7)
    assert torch.equal(stacked.token["a"][1, :, :3], before.token["a"][1].gather(-1, keep[0]))
    assert torch.equal(stacked.token["a"][[0, 2]], before.token["a"][[0, 2]])  # the other rows keep theirs
    with pytest.raises(ValueError, match="disagree"):
        PatternState.stack([PatternState(shared={"p": 1}), PatternState(shared={"p": 2})], [0, 0])


def test_an_attention_call_that_cannot_find_its_cache_layer_raises():
    model = tiny_model("llama", layers=2)
    ids = torch.randint(0, 100, (1, 12))
    strategy = Strategy.uniform(2, "snapkv", 6)
    foreign = PolyKVRuntime(model, strategy).new_cache()  # its layers report to another runtime
    with apply_strategy(model, strategy):
        with pytest.raises(RuntimeError, match="cache layer was not updated"):
            model(ids, cache=foreign)
        # no cache at all: plain attention, and the same logits as the unmodified model
        plain = model(ids, use_cache=False).logits
        model(ids)  # and a normal call works again afterwards
    torch.testing.assert_close(plain, model(ids, use_cache=False).logits)


def test_batched_rows_may_have_value_heads_of_another_size():
    gen = torch.Generator().manual_seed(1)
    rows = []
    n = 9
    for prefill in (PhasePlan(PATTERNS["knorm"](), 5), FULL_PLAN):  # rows of 5 and 9 tokens
        row = EvictingLayer(0, prefill, PhasePlan(PATTERNS["knorm"](), 6), **KW)
        row.update(torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D + 3, generator=gen))
        row.attention_call(torch.randn(1, H * G, n, D, generator=gen), None)
        rows.append(row)
    stacked = row_parts(0, rows, None, **KW)  # the decoding batch's layout
    stacked.update(torch.randn(2, H, 1, D, generator=gen), torch.randn(2, H, 1, D + 3, generator=gen))
    assert stacked.values.shape[-1] == D + 3 and stacked.keys.shape[-1] == D
    for i, row in enumerate(rows):
        assert torch.equal(stacked.values[i, :, : row.length], row.values[0])
    report = cache_report(rows).layers[0]  # FullKV bytes count keys and values at their own sizes
    assert report.full_kv_bytes == H * rows[0].seen * (D + D + 3) * 4
