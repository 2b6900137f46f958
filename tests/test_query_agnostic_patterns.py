"""The query-agnostic patterns of issue 26 against their papers' closed forms (kvpress's formulas),
beside the registry-wide kept-set tests (tests/test_runtime.py, tests/test_row_batch.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polykv_search.patterns import make_pattern
from polykv_search.patterns.state import PatternState
from polykv_search.runtime import FULL_PLAN, EvictingLayer

H, G, D = 2, 2, 8
KW = {"num_kv_heads": H, "groups": G, "scaling": D**-0.5}


def _layer(keys: torch.Tensor, values: torch.Tensor, **kw) -> EvictingLayer:
    layer = EvictingLayer(0, FULL_PLAN, FULL_PLAN, **KW, **kw)
    layer.update(keys, values)
    return layer


def test_keydiff_is_minus_the_cosine_to_the_mean_unit_key():
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(2, H, 15, D, generator=gen) * torch.rand(2, H, 15, 1, generator=gen) * 3
    layer = _layer(keys, torch.randn(2, H, 15, D, generator=gen))
    anchor = F.normalize(keys, p=2, dim=-1).mean(dim=2, keepdim=True)
    want = -F.cosine_similarity(keys, anchor, dim=-1)
    torch.testing.assert_close(make_pattern("keydiff").score(layer, PatternState()), want, rtol=1e-5, atol=1e-6)


def test_keydiff_anchor_ignores_padding():
    gen = torch.Generator().manual_seed(1)
    keys = torch.randn(1, H, 12, D, generator=gen)
    padded = _layer(keys, torch.randn(1, H, 12, D, generator=gen))
    padded.valid = padded.valid.clone()
    padded.valid[..., :4] = False  # left padding: its keys must not move the anchor
    alone = _layer(keys[..., 4:, :].clone(), torch.randn(1, H, 8, D, generator=gen))
    got = make_pattern("keydiff").score(padded, PatternState())[..., 4:]
    torch.testing.assert_close(got, make_pattern("keydiff").score(alone, PatternState()), rtol=1e-5, atol=1e-6)
