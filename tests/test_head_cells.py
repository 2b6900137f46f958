"""Streaming cells per (layer, KV head): the replay equals a full forward with a hand-built per-head mask, and
equals the runtime when the layer has one KV head; aggregation over samples."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny import tiny_model
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from polykv_search.runtime import apply_strategy
from signals.head_cells import check_cell_budgets, measure_head_cells, sample_cells_kl
from strategies import LayerChoice, Strategy

REF = "headcell_reference"
#: the cell the reference attention applies: {"layer", "head", "budget", "sink", "n"} (layer -1: none)
CELL: dict = {"layer": -1}
TOL = 2e-6  # fp32 KL of two differently ordered but exact computations (measured max ~2e-7)


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention over the whole sequence, causal, with the query heads of CELL's KV head in CELL's layer
    seeing, from each continuation query p >= n, only keys k < sink or k >= p - (budget - sink)."""
    _, hq, t, _ = query.shape
    groups = hq // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    weights = (query @ key.transpose(-1, -2)) * module.scaling
    q = torch.arange(t)[:, None]
    k = torch.arange(t)[None, :]
    mask = (k <= q).expand(hq, t, t).clone()
    if module.layer_idx == CELL["layer"]:
        window = CELL["budget"] - CELL["sink"]
        stream = (k < CELL["sink"]) | (k >= q - window) | (q < CELL["n"])
        for head in range(CELL["head"] * groups, (CELL["head"] + 1) * groups):
            mask[head] &= stream
    weights = weights.masked_fill(~mask[None], float("-inf")).softmax(-1)
    return (weights @ value).transpose(1, 2).contiguous(), None


AttentionInterface.register(REF, reference_attention)
AttentionMaskInterface.register(REF, lambda **_: None)


def naive_cells_kl(model, sample, budgets, sink) -> np.ndarray:
    """One full forward per cell: mean KL(FullKV || cell) over the sample's scored continuation tokens."""
    n, (start, end) = len(sample.context_ids), sample.scored
    ids = torch.tensor([list(sample.context_ids) + list(sample.continuation_ids)[:end]])
    cfg = model.config
    out = np.zeros((cfg.num_hidden_layers, cfg.num_key_value_heads, len(budgets)))
    previous, cfg._attn_implementation = cfg._attn_implementation, REF
    try:
        with torch.no_grad():
            CELL.update(layer=-1)
            full = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)
            for idx in np.ndindex(out.shape):
                CELL.update(layer=idx[0], head=idx[1], budget=budgets[idx[2]], sink=sink, n=n)
                cell = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)
                kl = (full.exp() * (full - cell)).sum(-1).clamp_min(0)  # row i: the token at i + 1
                out[idx] = np.mean([0.0 if t == 0 else float(kl[n + t - 1]) for t in range(start, end)])
    finally:
        cfg._attn_implementation = previous
        CELL.update(layer=-1)
    return out


def random_sample(seed: int, n: int, m: int, scored=None):
    ids = torch.randint(1, 128, (n + m,), generator=torch.Generator().manual_seed(seed)).tolist()
    return SimpleNamespace(context_ids=ids[:n], continuation_ids=ids[n:], scored=scored or (0, m))


@pytest.mark.parametrize(("family", "scored"), [("llama", None), ("qwen3", (3, 9))])
def test_the_replay_equals_a_full_forward_with_a_per_head_mask(family, scored):
    model = tiny_model(family, layers=3, seed=2)
    sample = random_sample(3, 40, 14, scored)
    budgets, sink = (6, 11), 2
    want = naive_cells_kl(model, sample, budgets, sink)
    got = sample_cells_kl(model, sample, budgets, sink)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert (want > 1e-4).all()  # every cell is a real change, not a trivial zero
    chunked = sample_cells_kl(model, sample, budgets, sink, batch_tokens=1)  # one row per chunk
    np.testing.assert_allclose(chunked, got, rtol=0, atol=TOL)
    assert not np.array_equal(got[:, 0], got[:, 1])  # heads differ


def test_a_budget_that_holds_everything_costs_nothing():
    model = tiny_model("llama", layers=2, seed=3)
    sample = random_sample(4, 30, 8)
    kl = sample_cells_kl(model, sample, (5, 64), 4)
    assert (kl[..., 0] > 1e-4).all()
    np.testing.assert_allclose(kl[..., 1], 0.0, atol=1e-7)


def test_with_one_kv_head_a_cell_is_the_runtimes_streaming_layer_decoding_step_by_step():
    """With one KV head per layer, streaming that head is streaming the layer: the runtime with streaming_llm
    in layer l in both phases (evicting every step), the continuation fed one token at a time."""
    model = tiny_model("llama", layers=3, seed=5, num_key_value_heads=1)
    sample = random_sample(6, 36, 10)
    budgets, sink, n = (7, 12), 3, 36
    cells = sample_cells_kl(model, sample, budgets, sink)
    ids = torch.tensor([sample.context_ids + sample.continuation_ids])

    def step_logprobs(strategy):
        with torch.no_grad(), apply_strategy(model, strategy):
            out = model(ids[:, :n], use_cache=True)
            rows, cache = [out.logits[0, -1]], out.cache
            for t in range(n, ids.shape[1] - 1):
                out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
                rows.append(out.logits[0, -1])
        return torch.log_softmax(torch.stack(rows).float(), -1)

    full = step_logprobs(Strategy.full(3))
    for layer in range(3):
        for g, budget in enumerate(budgets):
            choice = LayerChoice("streaming_llm", budget, {"n_sink": sink})
            choices = [choice if j == layer else LayerChoice("full", None) for j in range(3)]
            cell = step_logprobs(Strategy(choices, list(choices), None))
            kl = (full.exp() * (full - cell)).sum(-1).clamp_min(0)  # row t: continuation token t
            assert abs(float(kl.mean()) - cells[layer, 0, g]) < 1e-5, (layer, budget)


def test_measure_aggregates_per_sample_means_with_standard_errors():
    model = tiny_model("llama", layers=2, seed=7)
    evidence = [random_sample(s, 30, 10, (4, 8)) for s in (1, 2, 3)]
    prose = [random_sample(9, 30, 10)]
    seen = []
    cells = measure_head_cells(model, evidence, prose, budgets=(12, 6), sink=2, on_sample=lambda: seen.append(1))
    assert cells.budgets == (6, 12) and cells.sink == 2 and cells.pattern == "streaming_llm" and len(seen) == 4
    per = np.stack([sample_cells_kl(model, s, (6, 12), 2) for s in evidence])
    np.testing.assert_allclose(cells.kl_answer_mean, per.mean(0), atol=1e-12)
    np.testing.assert_allclose(cells.kl_answer_se, per.std(0, ddof=1) / np.sqrt(3), atol=1e-12)
    assert np.isnan(cells.kl_prose_se).all() and cells.kl_prose_mean.shape == (2, 2, 2)
    assert cells.provenance["evidence_samples"] == 3 and cells.provenance["prose_samples"] == 1
    top = cells.costliest(2, 6)
    assert top[0][2] == cells.kl_answer_mean[..., 0].max() and top[0][2] >= top[1][2]


@pytest.mark.parametrize(("budgets", "sink"), [((4, 8), 4), ((8, 8), 2), ((), 2), ((8,), -1)])
def test_bad_budgets_are_refused(budgets, sink):
    with pytest.raises(ValueError, match="budgets|sink"):
        check_cell_budgets(budgets, sink)


@pytest.mark.parametrize(
    ("pattern", "params"),
    [
        ("snapkv", {"window": 4}),
        ("h2o", {}),
        ("kvzip", {}),  # its reconstruction pass in the replay and in the runtime
        ("kvzip", {"allocation": "model"}),  # a pool of one head: the runtime's pooled allocation
        ("kvzip", {"plus": True}),  # KVzip+: the pass inputs in the replay's pass and for one head's group
        *(  # the same code path; slow only to keep the default suite short
            pytest.param(name, params, marks=pytest.mark.slow)
            for name, params in (
                ("knorm", {}),
                ("keydiff", {}),
                ("expected_attention", {}),
                ("pyramidkv", {"window": 4}),
            )
        ),
    ],
)
def test_prefill_cells_of_scored_patterns_equal_the_runtime_with_one_head_in_its_own_group(pattern, params):
    """A prefill cell (l, h, pattern, b) is the runtime with KV head h of layer l in a group of its own that
    compresses the prompt with the pattern to b and keeps every continuation token (fed in one call)."""
    from polykv_search.patterns import make_pattern
    from polykv_search.runtime.layer import FULL_PLAN, PhasePlan
    from polykv_search.runtime.layouts import HeadGroupPlan
    from signals.head_prefill_measure import sample_prefill_cells_kl

    model = tiny_model("llama", layers=3, seed=7)
    sample = random_sample(8, 40, 10, (2, 10))
    budgets, n = (8, 20), 40
    got = sample_prefill_cells_kl(model, sample, make_pattern(pattern, **params), budgets)
    ids = torch.tensor([sample.context_ids + sample.continuation_ids])

    def logprobs(**extra):
        with torch.no_grad(), apply_strategy(model, Strategy.full(3), **extra):
            out = model(ids[:, :n], use_cache=True)
            cont = model(ids[:, n:], cache=out.cache, use_cache=True).logits[0]
        return torch.log_softmax(torch.cat([out.logits[0, -1:], cont]).float(), -1)  # row t predicts token n + t

    full = logprobs()
    for layer in range(3):
        for head in range(2):
            for g, b in enumerate(budgets):
                groups = {
                    layer: [
                        HeadGroupPlan((head,), PhasePlan(make_pattern(pattern, **params), b), FULL_PLAN),
                        HeadGroupPlan((1 - head,), FULL_PLAN, FULL_PLAN),
                    ]
                }
                cell = logprobs(head_groups=groups)
                kl = (full.exp() * (full - cell)).sum(-1).clamp_min(0)
                want = np.mean([0.0 if t == 0 else float(kl[t]) for t in range(2, 10)])
                assert abs(got[layer, head, g] - want) < TOL, (layer, head, b)
    assert (got[..., 0] > 1e-4).all() and (got[..., 0] >= got[..., 1] - TOL).any()
