"""StackedLayer's in-place padded buffers equal a naive re-pad of its rows after every step,
through appends, evictions, growth past the headroom and rows of different lengths."""

from __future__ import annotations

import torch

from polykv_search.patterns import make_pattern
from polykv_search.runtime import FULL_PLAN, EvictingLayer, PhasePlan, StackedLayer

H, D = 2, 4


def row(prefill: PhasePlan, decoding: PhasePlan, n: int, seed: int) -> EvictingLayer:
    """A detached layer after a prefill of ``n`` tokens compressed by ``prefill``."""
    layer = EvictingLayer(0, prefill, decoding, num_kv_heads=H, groups=1, scaling=0.5)
    gen = torch.Generator().manual_seed(seed)
    layer.update(torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen))
    layer.begin_call(n, None)
    layer.end_call()
    return layer


def naive_pad(rows, name: str, fill):
    """Right-pad every row's tensor to the longest row (the reference)."""
    n = max(r.length for r in rows)
    out = []
    for r in rows:
        t = getattr(r, name)[0]
        pad = torch.full((t.shape[0], n - t.shape[1], *t.shape[2:]), fill, dtype=t.dtype)
        out.append(torch.cat([t, pad], dim=1))
    return torch.stack(out)


def test_buffers_equal_a_naive_repad_after_every_append_and_eviction():
    streaming, knorm = make_pattern("streaming_llm", n_sink=2), make_pattern("knorm")
    rows = [
        row(FULL_PLAN, FULL_PLAN, 30, 0),  # grows every step, never evicts
        row(PhasePlan(streaming, 6), PhasePlan(streaming, 6), 30, 1),  # evicts every step
        row(PhasePlan(knorm, 9), PhasePlan(knorm, 12), 30, 2),  # grows to 12, then evicts per head
    ]
    stacked = StackedLayer(0, rows, num_kv_heads=H, groups=1, scaling=0.5)
    gen = torch.Generator().manual_seed(7)
    for step in range(StackedLayer.HEADROOM + 10):  # past the headroom: the buffers are reallocated
        q = 3 if step == 0 else 1
        stacked.update(torch.randn(3, H, q, D, generator=gen), torch.randn(3, H, q, D, generator=gen))
        valid = naive_pad(rows, "valid", False)
        assert torch.equal(stacked.valid, valid)
        assert torch.equal(stacked.positions, naive_pad(rows, "positions", -1))
        for name in ("keys", "values"):  # padded slots may hold stale values; valid ones must match
            got, want = getattr(stacked, name), naive_pad(rows, name, 0.0)
            assert torch.equal(got[valid], want[valid])
        stacked.begin_call(q, None)
        stacked.end_call()
    assert [r.length for r in rows] == [30 + StackedLayer.HEADROOM + 12, 6, 12]
    assert rows[1].num_evictions > 0 and rows[2].num_evictions > 0
