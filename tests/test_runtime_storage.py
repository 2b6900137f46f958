"""The runtime's fast paths equal their plain definitions: in-place token storage, one-out eviction,
unpadded protection masks, mask-free attention for the newest query."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polykv_search.patterns import make_pattern
from polykv_search.patterns.base import protected_ends, select_keep, sinks_and_recent
from polykv_search.patterns.state import PatternState
from polykv_search.runtime.layer import FULL_PLAN, EvictingLayer, PhasePlan
from polykv_search.runtime.row_batch import RowCell
from polykv_search.runtime.storage import TokenStore


def layer(prefill=FULL_PLAN, decoding=FULL_PLAN, **kw) -> EvictingLayer:
    return EvictingLayer(0, prefill, decoding, num_kv_heads=2, groups=2, scaling=0.125, **kw)


def feed(lay: EvictingLayer, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g)
    lay.update(k, v)
    lay.begin_call(n, None)
    return k, v


def reference_keep(key: list[float], budget: int) -> list[int]:
    """Stable descending order (ties: older first), the first ``budget``, sorted by index."""
    order = sorted(range(len(key)), key=lambda i: (-key[i], i))
    return sorted(order[:budget])


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 40).flatmap(
        lambda n: st.tuples(
            st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, float("-inf")]), min_size=n, max_size=n),
            st.lists(st.booleans(), min_size=n, max_size=n),
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    )
)
def test_one_token_out_equals_the_stable_sort(case):
    scores, protect, valid = case
    n = len(scores)
    score = torch.tensor(scores)[None, None]
    prot, val = torch.tensor(protect)[None, None], torch.tensor(valid)[None, None]
    got = select_keep(score, val, prot, n - 1)[0, 0].tolist()  # the one-out path (n == budget + 1)
    # padding goes last even when protected; then protected; then by score
    key = [float("-inf") if not v else (float("inf") if p else s) for s, p, v in zip(scores, protect, valid)]
    assert got == reference_keep(key, n - 1)
    assert select_keep(score, val, prot, n - 2)[0, 0].tolist() == reference_keep(key, n - 2)  # the sort path


def test_unpadded_protection_mask_equals_the_ranked_one():
    lay = layer()
    feed(lay, 23)
    for budget, sink, recent in [(10, 4, 10), (10, 0, 5), (23, 4, 23), (5, 8, 8), (7, 0, 0)]:
        fast = protected_ends(lay, budget, sink, recent)
        assert torch.equal(fast, sinks_and_recent(lay.valid, budget, sink, recent))


def test_compact_rows_protection_mask_equals_the_ranked_one():
    counts, n = [23, 9, 1, 17], 23
    valid = (torch.arange(n)[None, None, :] < torch.tensor(counts)[:, None, None]).expand(4, 2, n)
    positions = torch.arange(n).expand(4, 2, n).masked_fill(~valid, -1)
    keys = torch.zeros(4, 2, n, 8)
    store = EvictingLayer(0, FULL_PLAN, FULL_PLAN, num_kv_heads=2, groups=1, scaling=1.0)  # a row batch's store
    store.hold_rows(TokenStore(keys, keys, positions, valid), counts)
    store.device, store.seen, store.calls, store.query_range = torch.device("cpu"), n, 1, range(n - 1, n)
    view = RowCell(store, make_pattern("h2o"), [0, 1, 2, 3], [1] * 4, PatternState())
    view.show(store, counts, num_evictions=1)
    for budget, sink, recent in [(10, 4, 10), (10, 0, 5), (23, 4, 23), (5, 8, 8), (7, 0, 0), (1, 0, 32)]:
        fast = protected_ends(view, budget, sink, recent)
        assert torch.equal(fast, sinks_and_recent(valid, budget, sink, recent))


def test_appending_never_changes_a_view_handed_out_before():
    lay = layer()
    k, v = feed(lay, 6)
    before = lay.keys
    snapshot = before.clone()
    for step in range(40):  # past the first store's capacity: it moves to a bigger one
        lay.update(torch.full((1, 2, 1, 8), float(step)), torch.zeros(1, 2, 1, 8))
    assert torch.equal(before, snapshot)
    assert torch.equal(lay.keys[:, :, :6], k) and torch.equal(lay.values[:, :, :6], v)
    assert lay.keys[0, 0, 6:, 0].tolist() == [float(s) for s in range(40)]
    assert lay.positions[0, 1].tolist() == list(range(46)) and bool(lay.valid.all())


def test_eviction_releases_the_prompt_storage():
    lay = layer(prefill=PhasePlan(make_pattern("streaming_llm"), 8))
    k, _ = feed(lay, 200)
    lay.end_call()
    assert lay.length == 8 and lay._store.capacity <= 8 + lay._slack()
    assert torch.equal(lay.keys[:, :, :4], k[:, :, :4]) and torch.equal(lay.keys[:, :, 4:], k[:, :, -4:])
    assert lay.positions[0, 0].tolist() == [0, 1, 2, 3, 196, 197, 198, 199]


def test_assigned_tensors_are_copied_before_the_first_append():
    lay = layer()
    feed(lay, 4)
    shared = torch.zeros(1, 2, 4, 8)
    lay.keys = shared  # e.g. a forked layer sharing its parent's prompt
    lay.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))
    assert torch.equal(shared, torch.zeros(1, 2, 4, 8)) and lay.length == 5


def test_the_newest_query_needs_no_mask_and_older_ones_do():
    lay = layer(prefill=PhasePlan(make_pattern("streaming_llm", n_sink=1), 5))
    feed(lay, 12)
    lay.end_call()  # evicted: positions 0, 8..11
    lay.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
    lay.begin_call(1, None)
    assert lay.visibility(range(12, 13)) is None
    assert bool(lay.allowed(range(12, 13)).all())
    older = lay.visibility(range(9, 10))
    assert older is not None and older[0, 0, 0].tolist() == [True, True, True, False, False, False]
    query = torch.randn(1, 4, 1, 8)
    fast = lay.attention_probs(query, range(12, 13))
    masked = lay.attention_probs(query, torch.tensor([12]))  # a tensor always takes the masked path
    assert torch.equal(fast, masked)


def test_padding_is_tracked_and_forgotten_once_evicted():
    lay = layer(prefill=PhasePlan(make_pattern("streaming_llm", n_sink=0), 3))
    k = torch.randn(1, 2, 6, 8)
    lay.update(k, k)
    lay.begin_call(6, torch.tensor([[0, 0, 1, 1, 1, 1]]))
    assert not lay.all_valid
    lay.end_call()  # keeps the 3 newest real tokens
    assert lay.all_valid and lay.positions[0, 0].tolist() == [3, 4, 5]
