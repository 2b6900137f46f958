"""The runtime under autograd: a forward with gradients enabled evicts exactly as one without, and no
pattern's remembered state holds the graph (eviction is not differentiable; the attention stays so)."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import PATTERNS, make_pattern
from polykv_search.runtime import apply_strategy
from polykv_search.runtime.layer import FULL_PLAN, PhasePlan
from polykv_search.runtime.layouts import HeadGroupPlan
from strategies import Strategy
from tests.tiny import tiny_model

#: every registered pattern, at a budget below the prompt so that prefill and every decoding step evict
NAMES = sorted(PATTERNS)


def prompt() -> torch.Tensor:
    return torch.randint(1, 128, (2, 20), generator=torch.Generator().manual_seed(5))


def prompt_and_steps(model, strategy, grad: bool, head_groups=None):
    with torch.set_grad_enabled(grad), apply_strategy(model, strategy, head_groups=head_groups) as rt:
        out = model(prompt(), use_cache=True)
        logits, cache = [out.logits], out.cache
        for _ in range(3):
            out = model(out.logits[:, -1:].argmax(-1), cache=cache, use_cache=True)
            logits.append(out.logits)
        layers = [g for layer in cache.layers for g in getattr(layer, "parts", [layer])]
        states = [s for layer in layers for s in layer.states.values()]
        kept = [layer.positions.clone() for layer in layers]
        assert rt.report(cache).kv_bytes > 0
    return logits, kept, states


def assert_evicts_as_without_gradients(model, strategy, head_groups=None) -> int:
    """Run with and without gradients: the same logits and kept tokens, differentiable logits, and no
    pattern state holding the graph; returns how many cache layers (head groups counted) were compared."""
    ref, ref_kept, _ = prompt_and_steps(model, strategy, grad=False, head_groups=head_groups)
    got, kept, states = prompt_and_steps(model, strategy, grad=True, head_groups=head_groups)
    assert all(a.requires_grad for a in got), "the logits must stay differentiable"
    for step, (a, b) in enumerate(zip(got, ref)):
        assert torch.allclose(a.detach(), b, atol=1e-6), f"call {step} differs"
    for a, b in zip(kept, ref_kept):
        assert torch.equal(a, b)
    held = [t for st in states for part in (st.token, st.row) for t in part.values() if torch.is_tensor(t)]
    assert not any(t.requires_grad for t in held), "a pattern's state holds the autograd graph"
    return len(kept)


@pytest.mark.parametrize("name", NAMES)
def test_a_forward_with_gradients_evicts_as_one_without(name):
    assert_evicts_as_without_gradients(tiny_model("llama", layers=2, seed=3), Strategy.uniform(2, name, 9))


def test_head_groups_under_gradients_evict_as_without():
    scored = PhasePlan(make_pattern("expected_attention"), 6)
    groups = {1: [HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN), HeadGroupPlan((1,), scored, scored)]}
    model, strategy = tiny_model("llama", layers=2, seed=3), Strategy.uniform(2, "tova", 9)
    assert assert_evicts_as_without_gradients(model, strategy, groups) == 3  # layer 0, layer 1's two groups


@pytest.mark.parametrize("name, differentiable", [("snapkv", True), ("h2o", True), ("kvzip", False)])
def test_kept_tokens_stay_in_the_graph_except_after_a_reconstruction_pass(name, differentiable):
    model = tiny_model("llama", layers=2, seed=3)
    with apply_strategy(model, Strategy.uniform(2, name, 9)):
        cache = model(prompt(), use_cache=True).cache
        assert all(layer.length == 9 for layer in cache.layers)
        assert all(layer.keys.requires_grad == differentiable for layer in cache.layers)
