"""No module-level relay between the cache and the attention function: a cache layer's ``update`` hands itself
to the attention call that follows through the ``kwargs`` dict transformers gives both (llama, mistral, qwen2,
qwen3), so two models run under two strategies side by side, a detached layer never reaches attention, and a
strategy applied twice to one model is refused."""

from __future__ import annotations

import pytest
import torch

from polykv_search.runtime import FULL_PLAN, EvictingLayer, PolyKVCache, apply_strategy
from polykv_search.runtime import attention as attn
from strategies import Strategy
from tests.test_runtime import batch
from tests.tiny import FAMILIES, tiny_model


@pytest.mark.parametrize("family", FAMILIES)
def test_two_models_under_two_strategies_interleave_with_their_own_caches(family):
    a, b = tiny_model(family, layers=2, seed=1), tiny_model(family, layers=2, seed=2)
    ids, mask = batch(seed=3, n=20, pad=4)
    with torch.no_grad():
        with apply_strategy(a, Strategy.uniform(2, "snapkv", 8)):
            alone_a = a(ids, attention_mask=mask).cache
        with apply_strategy(b, Strategy.uniform(2, "h2o", 12)):
            alone_b = b(ids, attention_mask=mask).cache
        with apply_strategy(a, Strategy.uniform(2, "snapkv", 8)), apply_strategy(b, Strategy.uniform(2, "h2o", 12)):
            got_a = a(ids, attention_mask=mask).cache
            got_b = b(ids, attention_mask=mask).cache
    for got, want in ((got_a, alone_a), (got_b, alone_b)):
        assert [layer.positions.tolist() for layer in got.layers] == [layer.positions.tolist() for layer in want.layers]
    assert got_a.layers[0].length == 8 and got_b.layers[0].length == 12


def test_a_detached_layer_never_reaches_attention():
    model = tiny_model("llama", layers=2)
    ids, _ = batch(seed=4, n=12, pad=0)
    with apply_strategy(model, Strategy.full(2)) as rt, torch.no_grad():
        layers = [EvictingLayer(i, FULL_PLAN, FULL_PLAN, **{**rt.layer_kwargs(i), "on_update": None}) for i in (0, 1)]
        with pytest.raises(RuntimeError, match="cache layer was not updated"):
            model(ids, cache=PolyKVCache(layers))


def test_the_layer_travels_in_the_call_kwargs_and_nothing_is_module_state():
    call: dict = {}
    layer = EvictingLayer(0, FULL_PLAN, FULL_PLAN, num_kv_heads=2, groups=2, scaling=0.5, on_update=None)
    attn.publish(call, "runtime", layer)
    assert call == {attn.LAYER_KEY: ("runtime", layer)}
    assert not any(isinstance(v, dict) and v for k, v in vars(attn).items() if not k.startswith("__"))


def test_a_strategy_applied_twice_to_one_model_is_refused():
    model = tiny_model("llama", layers=2)
    with apply_strategy(model, Strategy.full(2)):
        with pytest.raises(RuntimeError, match="already applied"):
            with apply_strategy(model, Strategy.full(2)):
                pass
    with apply_strategy(model, Strategy.full(2)):  # and again once the first has left
        pass
