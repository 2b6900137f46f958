"""``expected_attention``'s decoding fast path against its previous implementation
(``tests/expected_attention_reference.py``, kept verbatim): the same statistics to fp32 rounding, the same
scores to fp32 rounding, and the same kept token sets at every eviction.

Why the tolerances: the count (derived from the tokens seen) is exact; the mean and the centered sum of
outer products are kept in fp32 (a decoding step updates both in place, in fp32, by Welford's update; a
multi-token call merges in float64 and rounds once), so they agree with the previous float64 running sums
to fp32 rounding of their largest entries (checked at rtol 1e-5, atol 1e-6 of the largest). The score
changes its float order in fp32: the covariance is centered once, ``1/(2 D count)`` and ``1/sqrt(D)`` are
applied inside the product that adds the two terms, keys are rotated back by a ``[D, D]`` product instead
of ``rotate_half`` and the GQA group is reduced by bmm; each is a few fp32 roundings of the logits
(relative ~1e-7), so the scores agree to rtol 1e-5. A kept set can only change where two scores lie within
that rounding of each other at the cut-off (a near-tie); the cases below assert exact equality of every
kept set and never meet one.
"""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import make_pattern
from polykv_search.patterns.state import PatternState
from polykv_search.runtime import EvictingLayer
from polykv_search.runtime.layer import PhasePlan
from tests.expected_attention_reference import PreviousExpectedAttention
from tests.tiny import rope

CASES = [
    ({}, 2, 16),
    ({"n_sink": 0}, 3, 16),
    ({"n_sink": 6, "n_future_positions": 64}, 2, 32),
    ({"use_covariance": False}, 2, 16),
    ({"use_vnorm": False}, 1, 16),
    ({"epsilon": 0.05}, 2, 64),
]


def _run(params, groups, d, *, padded, interval=1, mode="within", budget=12, steps=14, seed=0, base=50.0):
    """Prefill, a 3-token call, then decoding steps through one layer evicting with the current pattern;
    the previous implementation observes the same calls. Yields (layer, new, new state, old, old state,
    budget) before every eviction."""
    h = 2
    gen = torch.Generator().manual_seed(seed)
    new = make_pattern("expected_attention", **params)
    old = PreviousExpectedAttention(**params)
    plan = PhasePlan(new, budget)
    kw = {"num_kv_heads": h, "groups": groups, "scaling": d**-0.5, "rotary": rope(d, base=base)}
    layer = EvictingLayer(0, plan, plan, decode_interval=interval, interval_mode=mode, **kw)
    old_state = PatternState()
    mask = torch.ones(2, 0, dtype=torch.long)
    for step in range(steps):
        q = 30 if step == 0 else 3 if step == 1 else 1
        pad = torch.ones(2, q, dtype=torch.long)
        if padded and step == 0:
            pad[1, :5] = 0  # a left-padded row
        mask = torch.cat((mask, pad), dim=1)
        scale = torch.rand(1, 1, q, 1, generator=gen) * 3  # keys and values of varied norms
        layer.update(torch.randn(2, h, q, d, generator=gen) * scale, torch.randn(2, h, q, d, generator=gen) * scale)
        query = torch.randn(2, h * groups, q, d, generator=gen) + torch.randn(1, h * groups, 1, d, generator=gen)
        layer.attention_call(query, mask if padded else None, finish=False)  # the current pattern's pre_kernel
        old.pre_kernel(layer, old_state, query)
        yield layer, new, layer.states[new], old, old_state, budget
        layer.end_call()


def _same_statistics(pattern, new_state: PatternState, old_state: PatternState) -> None:
    """Running mean and centered sum (now) against running sums (before): the same mean and covariance."""
    new, old = new_state.row, old_state.row
    assert torch.equal(pattern.count(new), old["count"]) and torch.equal(new["real_seen"], old["real_seen"])
    count = old["count"].clamp_min(1.0)[:, None, None]
    mean = old["q_sum"] / count
    assert new["mean"].dtype == torch.float32  # Welford's running mean, in place, in fp32
    torch.testing.assert_close(new["mean"].double(), mean, rtol=1e-5, atol=1e-6 * float(mean.abs().max()))
    if "q_outer" in old:
        cov = old["q_outer"] / count[..., None] - mean[..., :, None] * mean[..., None, :]
        got = per_query_head(new["m2"]).double() / count[..., None]
        torch.testing.assert_close(got, cov, rtol=1e-5, atol=1e-6 * float(cov.abs().max()))


def per_query_head(m2: torch.Tensor) -> torch.Tensor:
    """The running centered sums ``[B, Hkv, D, g, D]`` as one matrix per query head, ``[B, Hq, D, D]``."""
    b, h, d, g, _ = m2.shape
    return m2.transpose(2, 3).reshape(b, h * g, d, d)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("params", "groups", "d"), CASES)
def test_the_fast_path_scores_and_keeps_as_the_previous_implementation(params, groups, d, padded):
    evictions = 0
    for layer, new, state, old, old_state, budget in _run(params, groups, d, padded=padded):
        _same_statistics(new, state, old_state)
        got, want = new.score(layer, state), old.score(layer, old_state)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
        if layer.length > budget:
            evictions += 1
            assert torch.equal(new.cache_update(layer, state, budget), old.cache_update(layer, old_state, budget))
            assert torch.equal(  # the row-batched selection (one budget per row, as the scorer decodes)
                new.selection_key(layer, state, [budget, budget - 1], [1, 0]).argsort(dim=-1, stable=True),
                old.selection_key(layer, old_state, [budget, budget - 1], [1, 0]).argsort(dim=-1, stable=True),
            )
    assert evictions == 14  # the prompt, the 3-token call and every decoding step evicted


@pytest.mark.parametrize(("interval", "mode"), [(3, "within"), (3, "over")])
def test_multi_token_evictions_keep_as_the_previous_implementation(interval, mode):
    for layer, new, state, old, old_state, budget in _run({}, 3, 16, padded=False, interval=interval, mode=mode):
        if layer.length > budget:
            assert torch.equal(new.cache_update(layer, state, budget), old.cache_update(layer, old_state, budget))


def test_a_budget_below_the_sinks_and_a_cache_of_sinks_only():
    for layer, new, state, old, old_state, _ in _run({"n_sink": 8}, 2, 16, padded=False, budget=6, steps=4):
        for budget in (3, 6, layer.length - 1):
            assert torch.equal(new.cache_update(layer, state, budget), old.cache_update(layer, old_state, budget))
    for layer, new, state, old, old_state, _ in _run({"n_sink": 40}, 2, 16, padded=False, budget=20, steps=2):
        assert (new.score(layer, state) == 0).all() and (old.score(layer, old_state) == 0).all()
        assert torch.equal(new.cache_update(layer, state, 20), old.cache_update(layer, old_state, 20))


def test_rope_frames_invert_the_models_rotation_and_rotate_back_by_the_mean():
    from polykv_search.patterns.rope_frames import rotate_back, unrotate

    d = 16
    rotary = rope(d, base=50.0)
    cos, sin = rotary(range(7, 12))
    x = torch.randn(2, 3, 5, d, dtype=torch.float64)
    half = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    rotated = (x * cos.double() + half * sin.double()).float()
    torch.testing.assert_close(unrotate(rotated, cos, sin), x, rtol=1e-5, atol=1e-5)
    cos, sin = rotary(range(12, 76))
    k = torch.randn(3, 9, d)
    c, s = cos.mean(0), sin.mean(0)
    mat = (
        torch.diag(c.double())
        + s.double()[:, None]
        * torch.cat(  # R y = c * y + s * rotate_half(y)
            (
                torch.cat((torch.zeros(d // 2, d // 2), -torch.eye(d // 2)), 1),
                torch.cat((torch.eye(d // 2), torch.zeros(d // 2, d // 2)), 1),
            )
        ).double()
    )
    torch.testing.assert_close(rotate_back(k, cos, sin).double(), k.double() @ mat, rtol=1e-5, atol=1e-6)


def test_remembered_rotations_follow_new_and_modified_rotary_tensors():
    """The coefficients are remembered by the identity and version of ``(cos, sin)``: tensors changed in
    place, or other tensors asked for in turn, get their own (the latest entry is checked first)."""
    from polykv_search.patterns.rope_frames import unrotate_one

    d, rotary = 16, rope(16, base=50.0)
    x = torch.randn(2, 3, 1, d)

    def expected(cos, sin):
        half = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1).double()
        den = cos.double() ** 2 + sin.double() ** 2
        return ((x.double() * cos.double() - half * sin.double()) / den)[..., 0, :]

    first, second = (tuple(t.clone() for t in rotary(range(p, p + 1))) for p in (5, 9))
    for cos, sin in (first, second, second, first):
        torch.testing.assert_close(unrotate_one(x, cos, sin).double(), expected(cos, sin), rtol=1e-5, atol=1e-5)
    first[0].mul_(0.5)  # the latest entry, changed in place: its version moves on
    torch.testing.assert_close(unrotate_one(x, *first).double(), expected(*first), rtol=1e-5, atol=1e-5)


def test_the_cpu_decoding_step_equals_the_chunk_update_other_devices_use():
    """A one-token call on the CPU updates the statistics with Python counters; elsewhere it goes through
    the multi-token update (no host reads). Both give the same statistics."""
    from polykv_search.patterns.rope_frames import unrotate
    from polykv_search.runtime import FULL_PLAN

    d, rotary = 16, rope(16, base=50.0)
    gen = torch.Generator().manual_seed(3)
    layer = EvictingLayer(0, FULL_PLAN, FULL_PLAN, num_kv_heads=2, groups=2, scaling=d**-0.5, rotary=rotary)
    pattern, fast = make_pattern("expected_attention", n_sink=6), PatternState()
    chunked = None
    for q in (3, 1, 1, 1, 2, 1, 1, 1):  # the rows pass their 6 sinks during decoding
        layer.update(torch.randn(2, 2, q, d, generator=gen), torch.randn(2, 2, q, d, generator=gen))
        query = torch.randn(2, 4, q, d, generator=gen) + 1.0
        layer.attention_call(query, None, finish=False)
        if chunked is None:
            pattern.pre_kernel(layer, fast, query)
            chunked = fast.copy()
            continue
        pattern.pre_kernel(layer, fast, query)
        pattern._add_queries(chunked.row, unrotate(query, *rotary(layer.query_range)), None)
        for name, tensor in fast.row.items():
            tol = 1e-6 if tensor.dtype == torch.float32 else 1e-12  # the centered sums are fp32
            torch.testing.assert_close(chunked.row[name], tensor, rtol=tol, atol=tol * float(tensor.abs().max()))
    assert float(pattern.count(fast.row)[0]) == 11 - 6  # 11 queries, 6 sinks


def test_long_decoding_keeps_the_fp32_statistics_at_fp32_accuracy():
    """Welford's update in place, in fp32, over 4,000 decoding steps: the running mean and centered sums stay
    within 2e-5 of the float64 statistics of the same queries (relative to their largest entries)."""
    from polykv_search.patterns.rope_frames import unrotate

    d, hq, h, steps = 32, 4, 2, 4000
    rotary, gen = rope(d, base=10000.0), torch.Generator().manual_seed(5)
    pattern = make_pattern("expected_attention")
    row = {"real_seen": torch.zeros(1, dtype=torch.float64), "mean": torch.zeros(1, hq, d)}
    row["m2"] = torch.zeros(1, h, d, hq // h, d)
    offset, seen = torch.randn(1, hq, 1, d, generator=gen) * 3, []
    for t in range(steps):
        q = offset + torch.randn(1, hq, 1, d, generator=gen)
        cos, sin = rotary(range(t, t + 1))
        pattern._add_step(row, q, cos, sin)
        if t >= pattern.n_sink:
            seen.append(unrotate(q, cos, sin)[0, :, 0])
    x = torch.stack(seen)  # [steps - n_sink, Hq, D], float64
    mean = x.mean(0)
    centered = (x - mean).transpose(0, 1)  # [Hq, N, D]
    m2 = centered.transpose(1, 2) @ centered
    assert float(pattern.count(row)[0]) == steps - pattern.n_sink
    torch.testing.assert_close(row["mean"][0].double(), mean, rtol=0, atol=2e-5 * float(mean.abs().max()))
    got = per_query_head(row["m2"])[0].double()
    torch.testing.assert_close(got, m2, rtol=0, atol=2e-5 * float(m2.abs().max()))
