"""Head groups: a layer's KV heads split into groups, each its own dense store, plans and evictions.

Against the full-cache masking oracle, which evicts each group's heads with its own slow reference:
same kept (layer, row, head) token sets and fp32 logits, both phases, teacher-forced and step by step,
every pattern inside a group, the four random-init families; the bytes reported are what the groups
hold."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import PATTERNS, make_pattern
from polykv_search.runtime import apply_strategy
from polykv_search.runtime.layer import FULL_PLAN, PhasePlan
from polykv_search.runtime.layouts import GroupedLayer, HeadGroupPlan
from strategies import LayerChoice, Strategy
from tests.oracle import Oracle
from tests.test_runtime import batch, close, run_three_steps
from tests.tiny import FAMILIES, tiny_model

EVICTING = [name for name, cls in PATTERNS.items() if not cls.keeps_all]


def plan(name: str, budget: int | None, **params) -> PhasePlan:
    return FULL_PLAN if name == "full" else PhasePlan(make_pattern(name, **params), budget)


def choice(name: str, budget: int | None, **params) -> LayerChoice:
    return LayerChoice(name, None if name == "full" else budget, params)


def run_both(model, strategy, groups, *, interval=1, mode="within", steps=5, n=30):
    """The runtime and the oracle on the same batch; ``groups``: layer -> [(heads, prefill, decoding)] as
    ``(name, budget, params)`` triples."""
    runtime_groups = {
        layer: [HeadGroupPlan(tuple(h), plan(p[0], p[1], **p[2]), plan(d[0], d[1], **d[2])) for h, p, d in parts]
        for layer, parts in groups.items()
    }
    oracle_groups = {
        layer: [(h, choice(p[0], p[1], **p[2]), choice(d[0], d[1], **d[2])) for h, p, d in parts]
        for layer, parts in groups.items()
    }
    ids, mask = batch(seed=21, n=n, pad=4)
    cont = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(22))
    settings = dict(decode_interval=interval, interval_mode=mode)
    with apply_strategy(model, strategy, head_groups=runtime_groups, **settings) as rt:
        fast, cache = run_three_steps(model, strategy, ids, mask, cont, steps=steps)
        report = rt.report()
    with Oracle(model, strategy, head_groups=oracle_groups, **settings) as oracle:
        ref, _ = run_three_steps(model, strategy, ids, mask, cont, steps=steps)
    return fast, ref, cache, oracle, mask, report


def assert_same_kept(cache, oracle):
    for layer in cache.layers:
        parts = layer.parts if isinstance(layer, GroupedLayer) else [layer]
        heads = [g.heads for g in layer.kernel_groups] if isinstance(layer, GroupedLayer) else [range(2)]
        for part, part_heads in zip(parts, heads):
            for b in range(part.positions.shape[0]):
                for j, h in enumerate(part_heads):
                    got = sorted(part.positions[b, j].tolist())
                    assert got == oracle.kept_positions(layer.layer_idx, b, h), (
                        f"layer {layer.layer_idx} row {b} head {h}"
                    )


def mixed_groups():
    return {
        0: [((1,), ("full", None, {}), ("full", None, {})), ((0,), ("streaming_llm", 8, {}), ("streaming_llm", 8, {}))],
        2: [((0,), ("snapkv", 12, {"window": 4}), ("h2o", 11, {})), ((1,), ("tova", 9, {}), ("knorm", 10, {}))],
    }


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_head_groups_match_the_per_head_oracle(family, attn):
    model = tiny_model(family, attn=attn, layers=3, seed=5)
    strategy = Strategy.uniform(3, "h2o", 10)  # layer 1 stays layer-level
    fast, ref, cache, oracle, mask, report = run_both(model, strategy, mixed_groups())
    assert close(fast[0], ref[0], mask)
    for step, (a, b) in enumerate(zip(fast[1:], ref[1:])):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4), f"call {step + 1} differs"
    assert_same_kept(cache, oracle)
    # layer 0: head 1 keeps everything (30 prompt + 4 continuation + 5 decoded tokens), head 0 keeps 8
    layer0 = cache.layers[0]
    assert [p.length for p in layer0.parts] == [39, 8]
    per_token = 2 * 1 * 16 * 4 * 2  # batch 2 x 1 head x head size 16 x 4 bytes x (keys + values)
    assert report.layers[0].kv_bytes == per_token * (39 + 8) == layer0.kv_bytes()
    assert report.layers[0].kept == round((39 + 8) / 2)  # the mean over KV heads
    assert report.layers[1].kv_bytes == 2 * 2 * 16 * 4 * 2 * 10  # a plain layer: both heads at 10


STREAM = ("streaming_llm", 12, {})


@pytest.mark.parametrize("pattern", EVICTING)
@pytest.mark.parametrize("interval, mode", [(1, "within"), (3, "over")])
def test_every_pattern_inside_a_group_keeps_the_reference_token_set(pattern, interval, mode):
    model = tiny_model("llama", layers=3, seed=6)
    params = {"window": 4} if "window" in PATTERNS[pattern]().params() else {}
    # layer l > 0: head l - 1 applies the pattern, the other head sinks + recent, then H2O. Not layer 0:
    # its keys are each token's own key turned by RoPE, so a repeated token (greedy decoding repeats)
    # ties exactly under knorm, and rounding alone would pick the kept one, differently per CPU
    groups = {
        layer: [((layer - 1,), (pattern, 9, params), (pattern, 7, params)), ((2 - layer,), STREAM, ("h2o", 11, {}))]
        for layer in (1, 2)
    }
    fast, ref, cache, oracle, mask, _ = run_both(model, Strategy.full(3), groups, interval=interval, mode=mode)
    for a, b in zip(fast[1:], ref[1:]):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4)
    assert_same_kept(cache, oracle)


def test_groups_must_cover_every_kv_head_once():
    model = tiny_model("llama", layers=2)
    bad = {0: [HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN), HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN)]}
    with apply_strategy(model, Strategy.full(2), head_groups=bad) as rt:
        with pytest.raises(ValueError, match="cover KV heads 0..1 once each"):
            rt.new_cache()


def test_generate_with_head_groups_equals_step_by_step_decoding():
    model = tiny_model("qwen3", layers=2, seed=8)
    groups = {1: [HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN), HeadGroupPlan((1,), plan("tova", 6), plan("tova", 6))]}
    ids, mask = batch(seed=9, n=20, pad=3)
    with torch.no_grad(), apply_strategy(model, Strategy.full(2), head_groups=groups):
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        out = model(ids, attention_mask=mask, use_cache=True)
        cache, nxt, steps = out.cache, out.logits[:, -1:].argmax(-1), []
        full_mask = mask
        for _ in range(6):
            steps.append(nxt)
            full_mask = torch.cat([full_mask, torch.ones_like(nxt)], 1)
            nxt = model(nxt, attention_mask=full_mask, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
    assert torch.equal(gen[:, 20:], torch.cat(steps, 1))


def streaming_everywhere(layers: int = 2, budget: int = 7):
    """A layer-level streaming_llm strategy, and the same split into one head group per KV head (streaming
    keeps the same positions in every head, so both must generate the same tokens)."""
    strategy = Strategy.uniform(layers, "streaming_llm", budget)
    groups = {
        layer: [HeadGroupPlan((h,), plan("streaming_llm", budget), plan("streaming_llm", budget)) for h in range(2)]
        for layer in range(layers)
    }
    return strategy, groups


def test_beam_search_with_head_groups_equals_the_layer_level_strategy():
    model = tiny_model("llama", layers=2, seed=11)
    strategy, groups = streaming_everywhere()
    ids, mask = batch(seed=12, n=16, pad=2)
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, num_beams=3, num_return_sequences=3)
    with torch.no_grad():
        with apply_strategy(model, strategy):
            ref = model.generate(ids, **kwargs)
        with apply_strategy(model, strategy, head_groups=groups) as rt:
            got = model.generate(ids, **kwargs)
            assert isinstance(rt.new_cache().layers[0], GroupedLayer)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("move", ["reorder_cache", "batch_select_indices", "batch_repeat_interleave"])
def test_batch_moves_move_every_group_like_a_layer_level_layer(move):
    model = tiny_model("llama", layers=2, seed=13)
    strategy, groups = streaming_everywhere(budget=9)
    ids, mask = batch(seed=14, n=20, pad=3)
    arg = {"reorder_cache": torch.tensor([1, 0]), "batch_select_indices": torch.tensor([1])}.get(move, 2)
    caches = []
    with torch.no_grad():
        for extra in ({}, {"head_groups": groups}):
            with apply_strategy(model, strategy, **extra):
                cache = model(ids, attention_mask=mask, use_cache=True).cache
                getattr(cache, move)(arg)
                caches.append(cache)
    plain, grouped = caches
    for layer, split in zip(plain.layers, grouped.layers):
        for h, part in enumerate(split.parts):
            for name in ("keys", "values", "positions", "valid"):
                assert torch.equal(getattr(part, name), getattr(layer, name)[:, h : h + 1]), (move, name)
