"""The runtime under autograd: a forward with gradients enabled evicts exactly as one without, and no
pattern's remembered state holds the graph (eviction is not differentiable; the attention stays so)."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import PATTERNS, make_pattern
from polykv_search.runtime import apply_strategy
from polykv_search.runtime.eviction import FULL_PLAN, PhasePlan
from polykv_search.runtime.head_groups import HeadGroupPlan
from strategies import Strategy
from tests.tiny import tiny_model

#: every registered pattern, at a budget below the prompt so that prefill and every decoding step evict
NAMES = sorted(PATTERNS)


def prompt_and_steps(model, strategy, grad: bool, head_groups=None):
    ids = torch.randint(1, 128, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.set_grad_enabled(grad), apply_strategy(model, strategy, head_groups=head_groups) as rt:
        out = model(ids, use_cache=True)
        logits, cache = [out.logits], out.cache
        for _ in range(3):
            out = model(out.logits[:, -1:].argmax(-1), cache=cache, use_cache=True)
            logits.append(out.logits)
        layers = [g for layer in cache.layers for g in getattr(layer, "parts", [layer])]
        states = [s for layer in layers for s in layer.states.values()]
        kept = [layer.positions.clone() for layer in layers]
        assert rt.report(cache).kv_bytes > 0
    return logits, kept, states


@pytest.mark.parametrize("name", NAMES)
def test_a_forward_with_gradients_evicts_as_one_without(name):
    model = tiny_model("llama", layers=2, seed=3)
    strategy = Strategy.uniform(2, name, 9)
    ref, ref_kept, _ = prompt_and_steps(model, strategy, grad=False)
    got, kept, states = prompt_and_steps(model, strategy, grad=True)
    assert all(a.requires_grad for a in got), "the logits must stay differentiable"
    for step, (a, b) in enumerate(zip(got, ref)):
        assert torch.allclose(a.detach(), b, atol=1e-6), f"call {step} differs"
    for a, b in zip(kept, ref_kept):
        assert torch.equal(a, b)
    held = [t for st in states for part in (st.token, st.row) for t in part.values() if torch.is_tensor(t)]
    assert not any(t.requires_grad for t in held), "a pattern's state holds the autograd graph"


def test_head_groups_under_gradients_evict_as_without():
    model = tiny_model("llama", layers=2, seed=3)
    scored = PhasePlan(make_pattern("expected_attention"), 6)
    groups = {1: [HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN), HeadGroupPlan((1,), scored, scored)]}
    strategy = Strategy.uniform(2, "tova", 9)
    ref, ref_kept, _ = prompt_and_steps(model, strategy, grad=False, head_groups=groups)
    got, kept, states = prompt_and_steps(model, strategy, grad=True, head_groups=groups)
    assert len(kept) == 3 and all(a.requires_grad for a in got)
    for a, b in zip(got, ref):
        assert torch.allclose(a.detach(), b, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(kept, ref_kept))
    assert not any(t.requires_grad for st in states for t in st.row.values() if torch.is_tensor(t))


@pytest.mark.parametrize("name, differentiable", [("snapkv", True), ("h2o", True), ("kvzip", False)])
def test_kept_tokens_stay_in_the_graph_except_after_a_reconstruction_pass(name, differentiable):
    model = tiny_model("llama", layers=2, seed=3)
    ids = torch.randint(1, 128, (2, 20), generator=torch.Generator().manual_seed(5))
    with apply_strategy(model, Strategy.uniform(2, name, 9)):
        cache = model(ids, use_cache=True).cache
        assert all(layer.length == 9 for layer in cache.layers)
        assert all(layer.keys.requires_grad == differentiable for layer in cache.layers)
