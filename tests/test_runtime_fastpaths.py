"""The decoding fast paths equal the straightforward computations bit for bit: SnapKV's sliding query
buffer, the attention probabilities masked only on the columns a query may not see, SnapKV's in-place
window zeroing and protection, and the one-plan ``observers()``. SnapKV's window attention kept between calls
(``SnapKV.incremental``) give the same scores within float rounding and keep the same tokens."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F

from polykv_search.patterns.base import Pattern, protected_ends, select_keep
from polykv_search.patterns.pyramidkv import PyramidKV
from polykv_search.patterns.snapkv import SnapKV
from polykv_search.patterns.state import PatternState
from polykv_search.runtime.layer import FULL_PLAN, EvictingLayer, PhasePlan

D = 8


class RefLayer(EvictingLayer):
    """An EvictingLayer whose attention probabilities mask every column (the original definition)."""

    def attention_probs(self, query, query_positions, upto=None):
        b, hq, q, d = query.shape
        h, g = self.num_kv_heads, self.groups
        keys = self.keys if upto is None else self.keys[..., :upto, :]
        n = keys.shape[-2]
        scaled = query.float().reshape(b, h, g * q, d) * self.scaling
        logits = torch.matmul(scaled, keys.float().transpose(-1, -2)).view(b, h, g, q, n)
        mask = self.visibility(query_positions)
        if mask is not None:
            logits.masked_fill_(~mask[..., :n][:, :, None], float("-inf"))
        return logits.softmax(dim=-1).view(b, hq, q, n)

    def observers(self):
        plans = [self.plans["prefill"]] if self.calls == 0 else []
        plans.append(self.plans["decoding"])
        seen: dict = {}
        for plan in plans:
            if plan.evicts and plan.pattern not in seen:
                seen[plan.pattern] = self.states.setdefault(plan.pattern, PatternState())
        return list(seen.items())


def _ref_score(pattern: SnapKV, layer, state) -> torch.Tensor:
    probs = layer.attention_probs(state.row["query"], state.shared["query_pos"])
    votes = probs.sum(dim=-2)
    window = protected_ends(layer, votes.shape[-1], 0, pattern.window)
    votes = votes.masked_fill(layer.repeat_heads(window), 0.0)
    b, h, n = votes.shape
    flat = votes.reshape(b * h, 1, n)
    pool = F.avg_pool1d if pattern.pooling == "avgpool" else F.max_pool1d
    return layer.group_mean(pool(flat, pattern.kernel, stride=1, padding=pattern.kernel // 2).reshape(b, h, n))


@dataclass(frozen=True)
class RefSnapKV(SnapKV):
    """SnapKV as first written: concatenated window, full-mask scoring, the base class's selection."""

    name: ClassVar[str] = "ref_snapkv"

    def pre_kernel(self, layer, state, query) -> None:
        old_q, old_pos = state.row.get("query"), state.shared.get("query_pos")
        qpos = layer.query_range
        if old_q is not None and old_q.shape[0] == query.shape[0] and old_pos.stop == qpos.start:
            query = torch.cat([old_q, query], dim=-2)
            qpos = range(old_pos.start, qpos.stop)
        state.row["query"] = query[..., -self.window :, :]
        state.shared["query_pos"] = qpos[-self.window :]

    def score(self, layer, state) -> torch.Tensor:
        return _ref_score(self, layer, state)

    def selection_key(self, layer, state, budgets, rows=None):
        return Pattern.selection_key(self, layer, state, budgets, rows)


def naive_probs(layer: EvictingLayer, query: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
    """Per-query-head attention from first principles (keys copied per head, float64)."""
    keys = layer.repeat_heads(layer.keys).double()
    kpos = layer.repeat_heads(layer.positions)[:, :, None, :]
    valid = layer.repeat_heads(layer.valid)[:, :, None, :]
    q = qpos[None, None, :, None]
    ok = kpos <= q
    if layer.sliding_window is not None:
        ok &= (q - kpos) < layer.sliding_window
    ok = (ok & valid) | (kpos == q)
    logits = (query.double() @ keys.transpose(-1, -2)) * layer.scaling
    return logits.masked_fill(~ok, float("-inf")).softmax(-1)


def identical(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit for bit (NaN rows: a padding query whose own slot was dropped by the random eviction below)."""
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


CASES = [  # (batch, kv heads, groups, sliding window, left padding of row 0, pattern kwargs, budget)
    (1, 2, 1, None, 0, dict(window=4, kernel=3), 12),
    (2, 2, 3, None, 0, dict(window=6, kernel=5, pooling="maxpool"), 10),
    (2, 1, 2, None, 3, dict(window=5, kernel=3), 9),
    (1, 2, 2, 7, 0, dict(window=4, kernel=5), 11),
    (2, 2, 2, 9, 2, dict(window=3, kernel=1), 8),
    (1, 3, 1, None, 0, dict(window=16, kernel=3), 6),  # budget below the window
]


def _pair(case, seed: int):
    b, h, g, sliding, pad, kw, budget = case
    kwargs = dict(num_kv_heads=h, groups=g, scaling=0.3, sliding_window=sliding)
    fast = EvictingLayer(0, PhasePlan(SnapKV(**kw), budget), PhasePlan(SnapKV(**kw), budget), **kwargs)
    ref = RefLayer(0, PhasePlan(RefSnapKV(**kw), budget), PhasePlan(RefSnapKV(**kw), budget), **kwargs)
    return fast, ref, torch.Generator().manual_seed(seed), (b, h, g, pad)


def _call(layer, k, v, query, padding):
    layer.update(k, v)
    layer.attention_call(query, padding, lambda: None)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("incremental", [False, True])
def test_snapkv_decoding_keeps_exactly_what_the_plain_computation_keeps(case, seed, incremental, monkeypatch):
    monkeypatch.setattr(SnapKV, "incremental", incremental)
    fast, ref, gen, (b, h, g, pad) = _pair(case, seed)
    seen = 0
    for q_len in [20, 1, 1, 3, 1, 1, 1, 2, 1, 1, 1, 1, 5, 1, 1, 1, 1, 1, 1, 1]:
        k, v = torch.randn(b, h, q_len, D, generator=gen), torch.randn(b, h, q_len, D, generator=gen)
        query = torch.randn(b, h * g, q_len, D, generator=gen)
        seen += q_len
        padding = None
        if pad:
            padding = torch.ones(b, seen, dtype=torch.long)
            padding[0, :pad] = 0
        for layer in (fast, ref):
            _call(layer, k, v, query, padding)
        f_state, r_state = fast.states[fast.plans["decoding"].pattern], ref.states[ref.plans["decoding"].pattern]
        assert torch.equal(f_state.row["query"], r_state.row["query"])
        assert f_state.shared["query_pos"] == r_state.shared["query_pos"]
        assert torch.equal(fast.positions, ref.positions) and torch.equal(fast.valid, ref.valid)
        assert torch.equal(fast.keys, ref.keys)
        # the scores themselves, bit for bit (kept attention: within rounding), on the current (possibly evicted,
        # padded, sliding) cache
        pattern = fast.plans["decoding"].pattern
        got, want = pattern.score(fast, f_state), _ref_score(pattern, ref, r_state)
        torch.testing.assert_close(got, want, rtol=1e-5 if incremental else 0, atol=1e-7 if incremental else 0)
        for budget in {1, fast.length // 2, fast.length - 1} - {0}:
            assert torch.equal(
                pattern.cache_update(fast, f_state, budget),
                select_keep(Pattern.selection_key(pattern, ref, r_state, [budget]), None, None, budget),
            )
    assert fast.num_evictions > 3


@pytest.mark.parametrize("case", CASES)
def test_masking_only_the_hidden_columns_equals_the_full_mask(case):
    fast, ref, gen, (b, h, g, pad) = _pair(case, 3)
    n = 30
    k, v = torch.randn(b, h, n, D, generator=gen), torch.randn(b, h, n, D, generator=gen)
    padding = torch.ones(b, n, dtype=torch.long)
    padding[0, :pad] = 0
    for layer in (fast, ref):
        layer.update(k, v)
        layer.begin_call(n, padding if pad else None)
    for evicted in (False, True):
        for start, stop in [(0, n), (n - 1, n), (n - 5, n), (3, 9), (n - 12, n - 2), (n, n)]:
            query = torch.randn(b, h * g, stop - start, D, generator=gen)
            got = fast.attention_probs(query, range(start, stop))
            identical(got, ref.attention_probs(query, range(start, stop)))
            if stop > start:
                want = naive_probs(fast, query, torch.arange(start, stop))
                assert torch.allclose(got.double(), want, atol=1e-6, equal_nan=True)
                upto = fast.visible_prefix(stop - 1)
                identical(
                    fast.attention_probs(query, range(start, stop), upto),
                    ref.attention_probs(query, range(start, stop), upto),
                )
        if not evicted:  # keep a random sorted subset per row and head: positions with gaps
            keep = torch.rand(b, h, n, generator=gen).argsort(-1)[..., :17].sort(-1).values
            for layer in (fast, ref):
                layer.keys = layer.keys.gather(2, keep[..., None].expand(-1, -1, -1, D))
                layer.values = layer.values.gather(2, keep[..., None].expand(-1, -1, -1, D))
                layer.positions, layer.valid = layer.positions.gather(-1, keep), layer.valid.gather(-1, keep)
                layer.num_evictions = 1


def test_sliding_query_buffer_never_changes_an_earlier_window():
    lay = EvictingLayer(0, FULL_PLAN, PhasePlan(PyramidKV(), 64), num_kv_heads=1, groups=2, scaling=1.0)
    pattern = lay.plans["decoding"].pattern
    gen = torch.Generator().manual_seed(0)
    windows, queries = [], []
    for q_len in [5] + [1] * 40 + [3, 1, 1]:
        query = torch.randn(1, 2, q_len, D, generator=gen)
        queries.append(query)
        _call(lay, torch.randn(1, 1, q_len, D), torch.randn(1, 1, q_len, D), query, None)
        state = lay.states[pattern]
        windows.append((state.row["query"], state.row["query"].clone()))
        if len(windows) == 20:  # a copied state (fork) and a reordered one start buffers of their own
            twin = copy.deepcopy(state)
            lay.reorder_cache(torch.tensor([0]))
    for view, snapshot in windows:
        assert torch.equal(view, snapshot)
    assert torch.equal(windows[-1][0], torch.cat(queries, dim=-2)[..., -pattern.window :, :])
    assert twin.row["query"].shape[-2] == pattern.window
