"""The eviction runtime: exact when nothing is evicted, equal to a full-cache masking oracle when it is."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import PATTERNS
from polykv_search.runtime import UnsupportedModelError, apply_strategy
from polykv_search.runtime.architectures import model_spec
from strategies import LayerChoice, Strategy
from tests.oracle import Oracle
from tests.tiny import FAMILIES, tiny_model


def batch(seed=0, n=24, pad=5, vocab=128):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (2, n), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    return ids, mask


def close(a, b, mask):
    return torch.allclose(a[mask.bool()], b[mask.bool()], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["full", "budget-over-length"])
def test_no_eviction_is_identical_to_the_unmodified_model(family, attn, kind):
    model = tiny_model(family, attn=attn)
    L = model.config.num_hidden_layers
    strategy = Strategy.full(L) if kind == "full" else Strategy.uniform(L, "snapkv", 500)
    ids, mask = batch()
    with torch.no_grad():
        ref_logits = model(ids, attention_mask=mask).logits
        ref_gen = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
        with apply_strategy(model, strategy):
            logits = model(ids, attention_mask=mask).logits
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    assert close(logits, ref_logits, mask)
    assert torch.equal(gen, ref_gen)


def mixed_strategy(L: int) -> Strategy:
    """Different patterns and budgets per layer and per phase."""
    prefill = [("snapkv", 12, {"window": 4}), ("h2o", 10, {}), ("tova", 14, {}), ("pyramidkv", 9, {"window": 3})]
    decoding = [("h2o", 13, {}), ("streaming_llm", 11, {"n_sink": 2}), ("knorm", 12, {}), ("random", 10, {"seed": 3})]
    pick = lambda items: [LayerChoice(p, b, prm) for p, b, prm in (items * L)[:L]]  # noqa: E731
    return Strategy(pick(prefill), pick(decoding), global_budget=14, b_min=8)


def kept_sets(rt_cache, oracle):
    out = []
    for layer in rt_cache.layers:
        for b in range(layer.positions.shape[0]):
            for h in range(layer.positions.shape[1]):
                fast = sorted(layer.positions[b, h].tolist())
                ref = oracle.kept_positions(layer.layer_idx, b, h)
                out.append((layer.layer_idx, b, h, fast, ref))
    return out


def run_three_steps(model, strategy, ids, mask, cont, steps, interval=1):
    """Prefill, a teacher-forced continuation call, then step-by-step greedy decoding."""
    logits = []
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True)
        cache = out.cache
        logits.append(out.logits)
        full_mask = torch.cat([mask, torch.ones_like(cont)], 1)
        out = model(cont, attention_mask=full_mask, cache=cache, use_cache=True)
        logits.append(out.logits)
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            full_mask = torch.cat([full_mask, torch.ones_like(nxt)], 1)
            out = model(nxt, attention_mask=full_mask, cache=cache, use_cache=True)
            logits.append(out.logits)
            nxt = out.logits[:, -1:].argmax(-1)
    return logits, cache


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_mixed_strategy_matches_the_full_cache_masking_oracle(family, attn):
    model = tiny_model(family, attn=attn, layers=4, seed=1)
    strategy = mixed_strategy(4)
    ids, mask = batch(seed=2, n=26, pad=6)
    cont = torch.randint(1, 128, (2, 5), generator=torch.Generator().manual_seed(3))
    with apply_strategy(model, strategy):
        fast, cache = run_three_steps(model, strategy, ids, mask, cont, steps=6)
    with Oracle(model, strategy) as oracle:
        ref, _ = run_three_steps(model, strategy, ids, mask, cont, steps=6)
    assert close(fast[0], ref[0], mask)  # prefill
    for step, (a, b) in enumerate(zip(fast[1:], ref[1:])):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4), f"call {step + 1} differs"
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"layer {layer} row {b} head {h}"


#: every evicting pattern in the registry (``full`` never evicts: see the exactness tests above)
EVICTING = [name for name, cls in PATTERNS.items() if not cls.keeps_all]


@pytest.mark.parametrize("pattern", EVICTING)
@pytest.mark.parametrize("interval, mode", [(1, "within"), (3, "within"), (3, "over")])
def test_each_pattern_keeps_the_reference_token_set(pattern, interval, mode):
    model = tiny_model("llama", layers=2, seed=4)
    # a short observation window, so that window-based patterns (snapkv, pyramidkv) evict at 30 tokens
    params = {"window": 4} if "window" in PATTERNS[pattern]().params() else None
    strategy = Strategy.uniform(2, pattern, 10, params=params)
    ids, mask = batch(seed=5, n=30, pad=4)
    cont = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(6))
    with apply_strategy(model, strategy, decode_interval=interval, interval_mode=mode):
        fast, cache = run_three_steps(model, strategy, ids, mask, cont, steps=7)
    with Oracle(model, strategy, decode_interval=interval, interval_mode=mode) as oracle:
        ref, _ = run_three_steps(model, strategy, ids, mask, cont, steps=7)
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"{pattern}: layer {layer} row {b} head {h}"
    for a, b in zip(fast[1:], ref[1:]):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4)
    for layer in cache.layers:
        if mode == "within":  # never above the budget between calls, a multi-token call included
            assert layer.peak_length <= 10
        else:
            assert layer.length <= 10 + interval - 1


def test_prefill_lengths_equal_budgets_and_bytes_are_what_is_held():
    model = tiny_model("qwen3", layers=4)
    spec = model_spec(model)
    budgets = [8, 30, 12, 200]
    strategy = Strategy(
        [LayerChoice("snapkv", b, {"window": 4}) for b in budgets],
        [LayerChoice("h2o", b) for b in budgets],
        global_budget=80,
        b_min=8,
    )
    ids, mask = batch(n=40, pad=0)
    with apply_strategy(model, strategy) as rt:
        with torch.no_grad():
            model(ids, attention_mask=mask)
        report = rt.report()
    assert report.lengths == [min(b, 40) for b in budgets]
    per_token = spec.bytes_per_token(4) * ids.shape[0]
    assert report.kv_bytes == sum(report.lengths) * per_token
    assert report.full_kv_bytes == 40 * 4 * per_token
    for layer in rt.last_cache.layers:
        assert layer.keys.shape[-2] == layer.values.shape[-2] == layer.length


def test_generate_reports_seen_tokens_and_keeps_decoding_budget():
    model = tiny_model("mistral", layers=3)
    strategy = Strategy.from_choices([("tova", 16)] * 3, [("streaming_llm", 12)] * 3, global_budget=16, b_min=4)
    ids, mask = batch(n=30)
    with apply_strategy(model, strategy) as rt:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=9, do_sample=False)
        cache = rt.last_cache
    assert out.shape[1] == 39
    assert cache.get_seq_length() == 38  # tokens seen, not kept: positions stay absolute
    assert [layer.length for layer in cache.layers] == [12, 12, 12]


def test_model_is_restored_on_exit():
    model = tiny_model("llama")
    ids, mask = batch()
    with torch.no_grad():
        before = model(ids, attention_mask=mask).logits
        with apply_strategy(model, Strategy.uniform(3, "knorm", 4)):
            assert model.config._attn_implementation == "polykv"
        assert model.config._attn_implementation == "sdpa"
        assert not model._forward_pre_hooks
        after = model(ids, attention_mask=mask).logits
    assert torch.equal(before, after)


def test_unsupported_architecture_and_wrong_layer_count_are_clear_errors():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        with apply_strategy(gpt2, Strategy.full(2)):
            pass
    with pytest.raises(ValueError, match="strategy has 5 layers but the model has 3"):
        with apply_strategy(tiny_model("llama"), Strategy.full(5)):
            pass


def test_use_cache_false_runs_plain_causal_attention():
    model = tiny_model("qwen2")
    ids, mask = batch()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, use_cache=False).logits
        with apply_strategy(model, Strategy.uniform(3, "h2o", 4)):
            got = model(ids, attention_mask=mask, use_cache=False).logits
    assert close(got, ref, mask)


def test_a_forward_of_tokens_the_cache_has_already_seen_is_refused():
    """``generate(ids, cache=c)`` with ``c`` holding every token of ``ids`` feeds them all again (as it does
    with a ``DynamicCache``): refused in one message instead of a cache holding the prompt twice. A cache
    holding all but the last token, and a left-padded batch, continue."""
    model = tiny_model("llama")
    L = model.config.num_hidden_layers
    ids, mask = batch()
    with torch.no_grad(), apply_strategy(model, Strategy.uniform(L, "snapkv", 12)):
        cache = model(ids, attention_mask=mask, use_cache=True).cache
        refused = r"feeds 24 tokens that the cache has already seen \(24 tokens\)"
        with pytest.raises(ValueError, match=refused):
            model.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=2, do_sample=False, pad_token_id=0)
        with pytest.raises(ValueError, match=refused):  # no mask: the positions tell
            model(ids[:1], position_ids=torch.arange(24)[None], cache=model(ids[:1], use_cache=True).cache)
        cache = model(ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True).cache
        out = model.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=2, do_sample=False, pad_token_id=0)
        assert out.shape == (2, 26)
        # every row left-padded (e.g. padded to a multiple of 8): each step's positions stay below the tokens seen
        padded, pad_mask = (
            torch.cat((torch.zeros(2, 3, dtype=ids.dtype), ids), 1),
            torch.cat((torch.zeros(2, 3, dtype=mask.dtype), mask), 1),
        )
        out = model.generate(padded, attention_mask=pad_mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert out.shape == (2, 30)
