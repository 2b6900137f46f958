"""A row batch (the row_batch layout) decodes rows as one padded batch and keeps, for every row, exactly the tokens (and
pattern state) the row keeps alone: every registry pattern, per-row budgets inside one pattern group,
both interval modes, a multi-token call, GQA, rows leaving the batch."""

from __future__ import annotations

import copy
import zlib

import pytest
import torch

from polykv_search.patterns import PATTERNS, make_pattern
from polykv_search.patterns.selection import keep_per_row
from polykv_search.runtime import FULL_PLAN, EvictingLayer, PhasePlan
from polykv_search.runtime.layouts import row_batch
from polykv_search.runtime.reconstruction import needs_pass
from tests.tiny import rope

H, G, D = 2, 2, 4
KW = {"num_kv_heads": H, "groups": G, "scaling": 0.5, "rotary": rope(D)}
EVICTING = [p for p in PATTERNS if p != "full"]


def call(batch, query) -> None:
    """One attention call of a row batch whose kernel returns its queries: its store's call, the cells riding it."""

    def attend(store, q, inputs, riders):
        return store.attention_call(q, None, lambda: q.transpose(1, 2), riders=riders)

    batch.attention_call_grouped(query, attend)


def prefilled(prefill: PhasePlan, decoding: PhasePlan, prompt, query, **kw) -> EvictingLayer:
    """A detached layer after its prefill call on the shared prompt (hooks run, then compression; for a
    model-level pattern, a reconstruction call of 6 tokens in between)."""
    defer = needs_pass([(prefill, decoding)])
    layer = EvictingLayer(0, prefill, decoding, defer_prefill=defer, **KW, **kw)
    k, v = prompt
    layer.update(k, v)
    layer.attention_call(query, None)
    if defer:
        n = k.shape[-2]
        gen = torch.Generator().manual_seed(n)
        layer.begin_pass(n)
        layer.update(torch.randn(1, H, 6, D, generator=gen), torch.randn(1, H, 6, D, generator=gen))
        layer.attention_call(torch.randn(1, H * G, 6, D, generator=gen), None)
        layer.end_pass()
        assert (layer.length, layer.seen) == (n, n)
        layer.finish_deferred()
    return layer


def rows_for(pattern: str, n: int, gen, **kw) -> list[EvictingLayer]:
    p, other = make_pattern(pattern), make_pattern("snapkv" if pattern != "snapkv" else "h2o")
    plans = [
        (PhasePlan(p, 12), PhasePlan(p, 12)),
        (PhasePlan(other, 9), PhasePlan(p, 7)),  # another prefill pattern; a smaller decoding budget
        (FULL_PLAN, FULL_PLAN),  # never evicts
        (PhasePlan(p, n + 5), PhasePlan(p, 16)),  # the prefill keeps all, decoding grows to 16
        (PhasePlan(p, 10), PhasePlan(other, 10)),  # another group
        (PhasePlan(p, 5), PhasePlan(p, 3)),  # a budget below the interval
    ]
    prompt = (torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen))
    query = torch.randn(1, H * G, n, D, generator=gen)
    return [prefilled(a, b, prompt, query, **kw) for a, b in plans]


def assert_rows_equal(got: list[EvictingLayer], want: list[EvictingLayer]) -> None:
    for g, w in zip(got, want):
        assert torch.equal(g.positions, w.positions)
        assert torch.equal(g.keys, w.keys) and torch.equal(g.values, w.values)
        assert (g.num_evictions, g.peak_length, g.seen) == (w.num_evictions, w.peak_length, w.seen)
        assert g.states.keys() == w.states.keys()
        for pattern, state in w.states.items():
            for name, tensor in (*state.token.items(), *state.row.items()):
                got_state = g.states[pattern]
                got = got_state.token[name] if name in state.token else got_state.row[name]
                torch.testing.assert_close(got, tensor, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("pattern", EVICTING)
@pytest.mark.parametrize(("interval", "mode"), [(1, "within"), (3, "within"), (3, "over")])
def test_each_row_keeps_what_it_keeps_alone(pattern, interval, mode):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{pattern}/{interval}/{mode}".encode()))  # same every process
    kw = {"decode_interval": interval, "interval_mode": mode}
    alone = rows_for(pattern, 20, gen, **kw)
    batched = copy.deepcopy(alone)
    batch = row_batch(0, batched, **KW, **kw)
    active = list(range(len(alone)))
    for step in range(14):
        q = 5 if step == 0 else 1  # the question call, then decoding steps
        k, v = torch.randn(len(active), H, q, D, generator=gen), torch.randn(len(active), H, q, D, generator=gen)
        query = torch.randn(len(active), H * G, q, D, generator=gen)
        for j, r in enumerate(active):
            alone[r].update(k[j : j + 1], v[j : j + 1])
            alone[r].attention_call(query[j : j + 1], None)
        batch.update(k, v)
        call(batch, query)
        batch.write_back()
        assert_rows_equal([batched[r] for r in active], [alone[r] for r in active])
        if step == 8:  # two rows leave; the others go on in a new batch built from the written-back rows
            active = [r for r in active if r not in (1, 3)]
            batch = row_batch(0, [batched[r] for r in active], **KW, **kw)
    assert any(row.num_evictions > 1 for row in alone)


@pytest.mark.parametrize("pattern", EVICTING)
def test_a_row_under_budget_keeps_its_state_while_shorter_rows_of_its_group_evict(pattern):
    gen = torch.Generator().manual_seed(7)
    p = make_pattern(pattern)
    plans = [(PhasePlan(p, 5), PhasePlan(p, 4)), (PhasePlan(p, 30), PhasePlan(p, 40)), (FULL_PLAN, FULL_PLAN)]
    prompt = (torch.randn(1, H, 20, D, generator=gen), torch.randn(1, H, 20, D, generator=gen))
    query = torch.randn(1, H * G, 20, D, generator=gen)
    alone = [prefilled(a, b, prompt, query) for a, b in plans]
    batched = copy.deepcopy(alone)
    batch = row_batch(0, batched, **KW)
    for _ in range(6):  # row 0 evicts every step; row 1 (20+ tokens, budget 40) never does
        k, v = torch.randn(3, H, 1, D, generator=gen), torch.randn(3, H, 1, D, generator=gen)
        q = torch.randn(3, H * G, 1, D, generator=gen)
        for r in range(3):
            alone[r].update(k[r : r + 1], v[r : r + 1])
            alone[r].attention_call(q[r : r + 1], None)
        batch.update(k, v)
        call(batch, q)
    batch.write_back()
    assert alone[0].num_evictions > 3 and alone[1].num_evictions == 0
    assert_rows_equal(batched, alone)


def test_the_batch_is_the_rows_right_padded():
    gen = torch.Generator().manual_seed(0)
    rows = rows_for("h2o", 20, gen)
    batch = row_batch(0, copy.deepcopy(rows), **KW)
    ((store, cells),) = [(group.layer, group.riders) for group in batch.kernel_groups]
    n = max(r.length for r in rows)
    assert batch.keys.shape == (len(rows), H, n, D) and not store.all_valid
    for i, row in enumerate(rows):
        assert torch.equal(store.positions[i, :, : row.length], row.positions[0])
        assert not store.valid[i, :, row.length :].any() and (store.positions[i, :, row.length :] == -1).all()
    store.begin_call(0, None)
    cells.begin_call(0, None, False)
    for group in cells.row_groups:  # a group's view shows its rows' slots, values too (built when read)
        n = group.length
        assert torch.equal(group.values, batch.values[group.rows, :, :n])
        assert torch.equal(group.keys, batch.keys[group.rows, :, :n])


def test_keep_per_row_is_each_rows_stable_top_budget():
    gen = torch.Generator().manual_seed(3)
    key = torch.randint(0, 4, (5, 2, 11), generator=gen).float()  # many ties
    key[1, :, 7:] = float("-inf")  # padding
    budgets = [3, 6, 1, 11, 4]
    keep, kept = keep_per_row(key, budgets)
    for e in range(5):
        b = budgets[e]
        for h in range(2):  # stable: the older token first on ties
            order = sorted(range(11), key=lambda i: (-key[e, h, i].item(), i))
            assert keep[e, h, :b].tolist() == sorted(order[:b])
        assert kept[e, 0].tolist() == [True] * b + [False] * (keep.shape[-1] - b)
    same, all_kept = keep_per_row(key, [4] * 5)  # one budget for every row
    assert all_kept.all() and same.tolist() == [
        [sorted(sorted(range(11), key=lambda i: (-key[e, h, i].item(), i))[:4]) for h in range(2)] for e in range(5)
    ]


def test_one_token_out_per_row_selects_what_the_sort_selects():
    gen = torch.Generator().manual_seed(4)
    counts = [11, 8, 5, 2, 6]
    key = torch.randint(0, 3, (5, 2, 11), generator=gen).float()  # many ties
    key[0, 0, 3] = key[1, 1, 0] = float("inf")  # protected slots
    key[4] = float("inf")  # a row whose every key ties at +inf: its newest real token goes
    for e, c in enumerate(counts):
        key[e, :, c:] = float("-inf")  # padding
    budgets = [c - 1 for c in counts]
    fast, fast_kept = keep_per_row(key, budgets, counts)
    slow, slow_kept = keep_per_row(key, budgets)  # the sort
    assert torch.equal(fast_kept, slow_kept)
    assert torch.equal(fast.masked_fill(~fast_kept, 0), slow.masked_fill(~slow_kept, 0))
    assert fast[4, :, :5].tolist() == [[0, 1, 2, 3, 4]] * 2


def test_rows_must_share_the_prompt_and_be_past_prefill():
    gen = torch.Generator().manual_seed(1)
    a, b = rows_for("tova", 20, gen)[:2]
    b.seen += 1
    with pytest.raises(ValueError, match="same prompt"):
        row_batch(0, [a, b], **KW)
    with pytest.raises(ValueError, match="at least one row"):
        row_batch(0, [], **KW)
