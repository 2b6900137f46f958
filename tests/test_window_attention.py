"""SnapKV's window attention kept between calls (``SnapKV.incremental``, :mod:`polykv_search.patterns.window_attention`)
keep exactly the tokens the window recomputed at every call keeps, with scores within float rounding: rows
alone and row-batched (rows of different lengths, per-row budgets, both interval modes, rows leaving the
batch), and the decode suite's engine on the tiny families. Each test also checks that the kept weights served
(a decoding step computes one query row, not the window), so that it tests the fast path and not its fallback."""

from __future__ import annotations

import contextlib
import copy
import zlib

import pytest
import torch

from polykv_search.patterns import make_pattern, window_attention
from polykv_search.patterns.snapkv import SnapKV
from polykv_search.runtime import EvictingLayer, PhasePlan
from polykv_search.runtime.layouts import row_batch
from polykv_search.scoring import Entry
from polykv_search.scoring.trajectories import run_trajectories
from strategies import LayerChoice, Strategy
from tests.test_decode_batched import assert_same_outcomes, job_at, scorers
from tests.test_eval_support import char_tokenizer
from tests.test_row_batch import KW, D, G, H, assert_rows_equal, call, prefilled
from tests.test_scoring_engines import L
from tests.tiny import FAMILIES, tiny_model


@contextlib.contextmanager
def recomputed():
    """SnapKV's reference path: the window's attention computed from scratch at every call."""
    SnapKV.incremental = False
    try:
        yield
    finally:
        SnapKV.incremental = True


@pytest.fixture
def served(monkeypatch) -> list[int]:
    """One entry per call of the window's attention that the kept weights served: the query rows it computed."""
    calls: list[int] = []
    fresh: list[int] = []
    advance, new_rows = window_attention._advance, window_attention._new_rows

    def rows(layer, query, qpos):
        fresh.append(query.shape[-2])
        return new_rows(layer, query, qpos)

    def advancing(*args):
        fresh.clear()
        out = advance(*args)
        if out is not None:
            calls.append(sum(fresh))
        return out

    monkeypatch.setattr(window_attention, "_new_rows", rows)
    monkeypatch.setattr(window_attention, "_advance", advancing)
    return calls


def snap_rows(n: int, gen, **kw) -> list[EvictingLayer]:
    """Rows after their prefill on one prompt: SnapKV (window 4) and PyramidKV (window 3) at several budgets,
    one row past its budget only later, one with a budget below its window (the fallback's case)."""
    snap, pyramid = make_pattern("snapkv", window=4, kernel=3), make_pattern("pyramidkv", window=3)
    plans = [
        (PhasePlan(snap, 12), PhasePlan(snap, 12)),
        (PhasePlan(make_pattern("h2o"), 9), PhasePlan(snap, 7)),
        (PhasePlan(snap, n + 5), PhasePlan(snap, 16)),
        (PhasePlan(pyramid, 10), PhasePlan(pyramid, 8)),
        (PhasePlan(pyramid, 14), PhasePlan(pyramid, 11)),
    ]
    prompt = (torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen))
    query = torch.randn(1, H * G, n, D, generator=gen)
    return [prefilled(a, b, prompt, query, **kw) for a, b in plans]


@pytest.mark.parametrize(("interval", "mode"), [(1, "within"), (3, "within"), (3, "over")])
def test_row_batched_snapkv_keeps_what_the_recomputed_window_keeps(interval, mode, served):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{interval}/{mode}".encode()))
    kw = {"decode_interval": interval, "interval_mode": mode}
    reference = snap_rows(20, gen, **kw)
    rows = copy.deepcopy(reference)
    ref_alone, alone = copy.deepcopy(reference), copy.deepcopy(reference)
    batch, ref_batch = row_batch(0, rows, **KW, **kw), row_batch(0, reference, **KW, **kw)
    active = list(range(len(rows)))
    for step in range(24):
        q = 3 if step == 0 else 1
        k, v = torch.randn(len(active), H, q, D, generator=gen), torch.randn(len(active), H, q, D, generator=gen)
        query = torch.randn(len(active), H * G, q, D, generator=gen)
        batch.update(k, v)
        call(batch, query)
        for j, r in enumerate(active):
            alone[r].update(k[j : j + 1], v[j : j + 1])
            alone[r].attention_call(query[j : j + 1], None)
        with recomputed():
            ref_batch.update(k, v)
            call(ref_batch, query)
            for j, r in enumerate(active):
                ref_alone[r].update(k[j : j + 1], v[j : j + 1])
                ref_alone[r].attention_call(query[j : j + 1], None)
        store, ref_store = batch.kernel_groups[0].layer, ref_batch.kernel_groups[0].layer
        assert torch.equal(store.positions, ref_store.positions) and store.counts == ref_store.counts
        batch.write_back()
        ref_batch.write_back()
        assert_rows_equal([rows[r] for r in active], [reference[r] for r in active])
        assert_rows_equal([alone[r] for r in active], [ref_alone[r] for r in active])
        if step == 12:  # two rows leave; the others go on in new batches (their memos start again)
            active = [r for r in active if r not in (1, 3)]
            batch = row_batch(0, [rows[r] for r in active], **KW, **kw)
            ref_batch = row_batch(0, [reference[r] for r in active], **KW, **kw)
    assert all(row.num_evictions > 3 for row in reference)
    # the kept weights served: most calls computed the new queries only (the interval's steps at most)
    assert sum(c <= interval for c in served) > 16


def test_a_budget_below_the_window_falls_back_to_the_recomputed_window(served):
    """A window query older than every kept token sees nothing: its row would be NaN, which layers treat
    differently, so the whole window is recomputed (and the memo dropped)."""
    gen = torch.Generator().manual_seed(3)
    snap = make_pattern("snapkv", window=8, kernel=3)
    prompt = (torch.randn(1, H, 20, D, generator=gen), torch.randn(1, H, 20, D, generator=gen))
    layer = prefilled(PhasePlan(snap, 6), PhasePlan(snap, 5), prompt, torch.randn(1, H * G, 20, D, generator=gen))
    ref = copy.deepcopy(layer)
    for _ in range(6):
        k, v, q = (torch.randn(1, h, 1, D, generator=gen) for h in (H, H, H * G))
        layer.update(k, v)
        layer.attention_call(q, None)
        with recomputed():
            ref.update(k, v)
            ref.attention_call(q, None)
        assert torch.equal(layer.positions, ref.positions)
        assert window_attention.MEMO not in layer.states[snap].memo
    assert served == []


def snapkv_entries(budget: int = 24) -> list[Entry]:
    """FullKV, uniform SnapKV (window 8) at two budgets, and a mix of SnapKV, PyramidKV and H2O by layer."""
    snap = LayerChoice("snapkv", budget, {"window": 8})
    mixed = [LayerChoice("snapkv", budget - 4, {"window": 6}), LayerChoice("pyramidkv", budget), ("h2o", budget)]
    return [
        Entry("full", Strategy.full(L), "baseline", "full"),
        Entry("uniform-snapkv", Strategy.from_choices([snap] * L, [snap] * L, float(budget)), "baseline", "s"),
        Entry("snapkv-half", Strategy.uniform(L, "snapkv", budget // 2, params={"window": 4}), "strategy", "s"),
        Entry("mixed", Strategy.from_choices(mixed[:L], list(reversed(mixed))[:L], float(budget)), "strategy", "m"),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_decode_engine_keeps_what_the_recomputed_window_keeps(family, served):
    """Two samples stepped as one batch (FullKV a row beside the entries), decode interval 2: every entry's
    agreement, answers and KV bytes equal, KL and ΔNLL within float tolerance."""
    model, tok = tiny_model(family), char_tokenizer()
    jobs = [job_at(tok, 0, n=24, question=True), job_at(tok, 300, n=24, question=True)]
    es = snapkv_entries()
    rt, _, fast = scorers(model, es, decode_interval=2)
    try:
        got = run_trajectories(fast, jobs)
        with recomputed():
            want = run_trajectories(fast, jobs)
    finally:
        rt.__exit__(None, None, None)
    for ref, new in zip(want, got):
        assert_same_outcomes(ref, new, [e.name for e in es])
    assert all(o.pred["kl"] > 0 for o in got[0][1:])  # the entries evict and drift: a test that can fail
    assert sum(c <= 2 for c in served) > 20  # decoding steps: the new queries only
