"""A decoding batch cut into two parts, each padded to its own longest row (row_parts), keeps every
row's tokens, predictions and logits exactly as the per-entry path does; the cut and the batch plan
follow the padded-slot cost. Inside a part, each decoding pattern group's rows are consecutive."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import make_pattern
from polykv_search.runtime import FULL_PLAN, GroupedLayer, PhasePlan
from polykv_search.runtime import layouts as layouts_module
from polykv_search.runtime.layouts import best_split, layer_slots, row_parts
from polykv_search.runtime.row_batch import RowCells
from polykv_search.scoring import stacking
from polykv_search.scoring.shared import plan_groups
from tests.test_eval_support import char_tokenizer
from tests.test_row_batch import KW, prefilled
from tests.test_scoring_engines import assert_same, entries, jobs, run_both
from tests.tiny import FAMILIES, tiny_model


@pytest.fixture
def built(monkeypatch) -> list:
    """Every layer of row groups (row_parts' GroupedLayer) the engine builds during the test."""
    layers = []

    class Spy(GroupedLayer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.kernel_groups[0].rows is not None:
                layers.append(self)

    monkeypatch.setattr(layouts_module, "GroupedLayer", Spy)
    return layers


def test_best_split_cuts_where_padding_costs_most_and_only_when_it_pays():
    # ten 64-token rows and one 2,048-token row: 11 x 2,048 padded vs 10 x 64 + 2,048 split
    assert best_split([64] * 10 + [2048], min_saving=4096) == 10
    assert layer_slots([64] * 10 + [2048], 4096) == 10 * 64 + 2048
    assert layer_slots([64] * 10 + [2048], None) == 11 * 2048
    assert best_split([64, 2048, 64], min_saving=0) in (1, 2)  # the first best cut
    assert best_split([64, 70, 66], min_saving=4096) is None  # saves 12 slots: one padded part
    assert best_split([64], min_saving=0) is None  # one row: nothing to cut


def test_plan_groups_puts_a_long_row_in_the_batch_when_a_split_layer_serves_it():
    short, long = [16, 16, 16], [400, 400, 400]
    assert plan_groups([short, short, long], max_rows=8, fixed_cost=100) == [[0, 1], [2]]  # padded: apart
    assert plan_groups([short, short, long], max_rows=8, fixed_cost=100, split=64) == [[0, 1, 2]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_split_batches_equal_the_per_entry_path(family, kind, built):
    model, tok = tiny_model(family), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    reference, shared = run_both(model, entries(), job, split=0)
    assert built  # the split path ran
    assert_same(reference, shared, job)


def test_split_batches_with_decode_interval_and_eos_equal_the_per_entry_path():
    model, tok = tiny_model("llama"), char_tokenizer()
    _, gen = jobs(tok)
    reference, shared = run_both(model, entries(), gen, decode_interval=3, split=0)
    assert_same(reference, shared, gen)


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_head_group_rows_decode_in_the_batch_as_parts_and_equal_the_per_entry_path(kind, monkeypatch):
    from tests.test_decode_batched import counted_shared_groups
    from tests.test_scoring_head_groups import head_entries
    from tests.test_scoring_head_groups import run_both as run_both_heads

    shared_groups: list = []
    monkeypatch.setattr(stacking, "shared_head_groups", counted_shared_groups(shared_groups))
    model, tok = tiny_model("llama"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    reference, shared = run_both_heads(model, head_entries(), job)
    # head-group rows share the batch (one forward) with the layer-level rows; in each layer the head-group rows
    # (one head split) are one part, a row batch per head set (polykv_search.scoring.stacking): three rows in
    # layers 0 and 1, two in layer 2 (heads-mixed is layer-level there)
    assert sorted(len(rows) for rows in shared_groups) == [2, 3, 3]
    assert_same(reference, shared, job)


def test_each_decoding_group_is_consecutive_in_its_row_batch_and_outputs_come_back_in_batch_order():
    gen = torch.Generator().manual_seed(0)
    h, g, d, n = KW["num_kv_heads"], KW["groups"], 4, 12
    snap, h2o = PhasePlan(make_pattern("snapkv"), 8), PhasePlan(make_pattern("h2o"), 6)
    decoding = [snap, h2o, FULL_PLAN, snap, h2o]  # the groups interleave in batch order
    prompt = (torch.randn(1, h, n, d, generator=gen), torch.randn(1, h, n, d, generator=gen))
    query = torch.randn(1, h * g, n, d, generator=gen)
    members = [prefilled(PhasePlan(make_pattern("tova"), 10), plan, prompt, query) for plan in decoding]
    layer = row_parts(0, members, None, **KW)
    ((part, cells),) = [(group.layer, group.riders) for group in layer.kernel_groups]
    assert isinstance(cells, RowCells) and cells.rows == [members[i] for i in (0, 3, 1, 4, 2)]
    assert [grp.index for grp in cells.row_groups] == [slice(0, 2), slice(2, 4)]  # slices: no gather
    k, v = torch.randn(5, h, 1, d, generator=gen), torch.randn(5, h, 1, d, generator=gen)
    layer.update(k, v)
    for slot, row in enumerate((0, 3, 1, 4, 2)):  # each row's new token went to its own store row
        assert torch.equal(part.keys[slot, :, part.counts[slot] - 1], k[row, :, 0])
    q = torch.randn(5, h * g, 1, d, generator=gen)
    out = layer.attention_call_grouped(q, lambda part, query, *_: query.transpose(1, 2))  # the kernel's layout
    assert torch.equal(out, q.transpose(1, 2))


def test_a_batch_already_in_group_order_stays_one_row_batch():
    gen = torch.Generator().manual_seed(1)
    h, g, d, n = KW["num_kv_heads"], KW["groups"], 4, 12
    snap = PhasePlan(make_pattern("snapkv"), 8)
    prompt = (torch.randn(1, h, n, d, generator=gen), torch.randn(1, h, n, d, generator=gen))
    query = torch.randn(1, h * g, n, d, generator=gen)
    members = [prefilled(snap, plan, prompt, query) for plan in (snap, snap, FULL_PLAN)]
    (group,) = row_parts(0, members, None, **KW).kernel_groups
    assert group.rows is None and isinstance(group.riders, RowCells)
