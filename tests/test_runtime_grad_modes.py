"""A cache prefilled inside ``torch.inference_mode`` decodes outside it (``generate()`` runs under
``no_grad``), and one prefilled outside it decodes inside it, evicting exactly as a cache used in one
mode throughout: every pattern, head groups, and a model-level pattern."""

from __future__ import annotations

import contextlib

import pytest
import torch

from polykv_search.patterns import PATTERNS, make_pattern
from polykv_search.runtime import apply_strategy
from polykv_search.runtime.layer import FULL_PLAN, PhasePlan
from polykv_search.runtime.layouts import HeadGroupPlan
from strategies import Strategy
from tests.tiny import tiny_model

MODES = {"inference": torch.inference_mode, "no_grad": torch.no_grad, "grad": contextlib.nullcontext}


def prompt() -> torch.Tensor:
    return torch.randint(1, 128, (2, 20), generator=torch.Generator().manual_seed(5))


def decode(model, strategy, prefill_mode: str, decode_mode: str, head_groups=None):
    """Prefill in one mode, three greedy steps in another: every call's logits and each layer's kept
    positions (head groups counted)."""
    with apply_strategy(model, strategy, head_groups=head_groups):
        with MODES[prefill_mode]():
            out = model(prompt(), use_cache=True)
        logits, cache = [out.logits.detach().clone()], out.cache
        with MODES[decode_mode]():
            for _ in range(3):
                out = model(out.logits[:, -1:].argmax(-1), cache=cache, use_cache=True)
                logits.append(out.logits.detach().clone())
        layers = [g for layer in cache.layers for g in getattr(layer, "parts", [layer])]
        return logits, [layer.positions.clone() for layer in layers]


def assert_same_as_one_mode(model, strategy, prefill_mode, decode_mode, head_groups=None) -> None:
    ref, ref_kept = decode(model, strategy, "inference", "inference", head_groups)
    got, kept = decode(model, strategy, prefill_mode, decode_mode, head_groups)
    for step, (a, b) in enumerate(zip(got, ref)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=f"call {step} differs")
    assert len(kept) == len(ref_kept)
    for a, b in zip(kept, ref_kept):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_a_prompt_prefilled_inside_inference_mode_decodes_outside_it(name):
    model = tiny_model("llama", layers=2, seed=3)
    assert_same_as_one_mode(model, Strategy.uniform(2, name, 9), "inference", "no_grad")


@pytest.mark.parametrize(("prefill_mode", "decode_mode"), [("inference", "grad"), ("no_grad", "inference")])
def test_other_mode_changes_decode_as_one_mode(prefill_mode, decode_mode):
    model = tiny_model("llama", layers=2, seed=3)
    assert_same_as_one_mode(model, Strategy.uniform(2, "expected_attention", 9), prefill_mode, decode_mode)


def test_head_groups_prefilled_inside_inference_mode_decode_outside_it():
    scored = PhasePlan(make_pattern("expected_attention"), 6)
    groups = {1: [HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN), HeadGroupPlan((1,), scored, scored)]}
    model = tiny_model("llama", layers=2, seed=3)
    assert_same_as_one_mode(model, Strategy.uniform(2, "snapkv", 9), "inference", "no_grad", head_groups=groups)


def test_the_first_forward_outside_inference_mode_copies_the_cache_once():
    model = tiny_model("llama", layers=2, seed=3)
    with apply_strategy(model, Strategy.uniform(2, "expected_attention", 9)):
        with torch.inference_mode():
            out = model(prompt(), use_cache=True)
        cache = out.cache
        assert cache.holds_inference and cache.layers[0].keys.is_inference()
        with torch.no_grad():
            out = model(out.logits[:, -1:].argmax(-1), cache=cache, use_cache=True)
        assert not cache.holds_inference
        for layer in cache.layers:
            assert not layer.keys.is_inference()
            held = [t for st in layer.states.values() for part in (st.token, st.row) for t in part.values()]
            assert held and not any(t.is_inference() for t in held)


def test_generate_continues_a_cache_prefilled_inside_inference_mode():
    """``generate()`` (under its own ``no_grad``) continuing a prompt whose first tokens were prefilled
    inside ``torch.inference_mode``: the same tokens as from a cache prefilled under ``no_grad``."""
    model = tiny_model("llama", layers=2, seed=3)
    ids = prompt()
    got = {}
    for mode in ("inference", "no_grad"):
        with apply_strategy(model, Strategy.uniform(2, "expected_attention", 9)):
            with MODES[mode]():
                cache = model(ids[:, :-1], use_cache=True).cache
            got[mode] = model.generate(ids, cache=cache, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got["inference"], got["no_grad"])
    assert got["inference"].shape[1] == ids.shape[1] + 4
