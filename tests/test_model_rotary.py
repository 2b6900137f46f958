"""``ModelRotary``: the model's own RoPE ``(cos, sin)`` by position, cached per range, never stale."""

from __future__ import annotations

import torch

from polykv_search.runtime.architectures import ModelRotary, _rotary_module
from tests.tiny import tiny_model


def reference(module, positions: range) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.empty(0, dtype=torch.float32)
    cos, sin = module(x, torch.arange(positions.start, positions.stop)[None])
    return cos[0], sin[0]


def test_answers_are_the_modules_own_and_cached_per_range():
    module = _rotary_module(tiny_model("llama", layers=1))
    rotary = ModelRotary(module)
    first = rotary(range(5, 9))
    for got, want in zip(first, reference(module, range(5, 9))):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert rotary(range(5, 9))[0] is first[0]  # a cache hit
    torch.testing.assert_close(rotary(torch.tensor([5, 6, 7, 8]))[1], first[1], rtol=0, atol=0)


def test_a_changed_or_replaced_frequency_buffer_is_not_answered_from_the_cache():
    module = _rotary_module(tiny_model("llama", layers=1))
    rotary = ModelRotary(module)
    before = rotary(range(3, 7))[1].clone()
    module.inv_freq.mul_(2.0)  # updated in place (a dynamic RoPE type does this)
    doubled = rotary(range(3, 7))[1]
    assert not torch.equal(doubled, before)
    torch.testing.assert_close(doubled, reference(module, range(3, 7))[1], rtol=0, atol=0)
    module.register_buffer("inv_freq", module.inv_freq / 2.0, persistent=False)  # replaced
    torch.testing.assert_close(rotary(range(3, 7))[1], before, rtol=0, atol=0)
