"""TOVA after a per-head prefill (docs/design.md, "TOVA after a per-head prefill").

A per-head prefill (snapkv) leaves each KV head holding different tokens, so slot ``i`` is a different token in
each head. TOVA then scores a token by the attention the newest query gives it, averaged over the query heads,
0 from a head that does not hold it, and each head ranks the tokens it holds by that score. It must keep the
full-cache oracle's tokens (tests/oracle.py, its own slow reference of that rule), and where all heads hold the
same tokens it is the plain mean over heads slot by slot (one shared selection), as before.
"""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns.tova import held_token_mean
from polykv_search.runtime import apply_strategy
from strategies import LayerChoice, Strategy
from tests.test_evidence import PROMPT, runtime_and_oracle
from tests.test_runtime import batch, kept_sets
from tests.tiny import FAMILIES, tiny_model

SNAPKV = LayerChoice("snapkv", 16, {"window": 4})  # per KV head: the heads keep different prompt tokens


def naive_held_token_mean(probs, positions, valid):
    """Per slot: sum over query heads of the attention that head gives the slot's token (0 if it does not hold
    it), divided by the number of query heads; padding slots 0."""
    B, Hq, n = probs.shape
    groups = Hq // positions.shape[1]
    out = torch.zeros(positions.shape)
    for b in range(B):
        for h in range(positions.shape[1]):
            for i in range(n):
                if not valid[b, h, i]:
                    continue
                token, total = int(positions[b, h, i]), 0.0
                for hq in range(Hq):
                    for j in range(n):
                        if valid[b, hq // groups, j] and int(positions[b, hq // groups, j]) == token:
                            total += float(probs[b, hq, j])
                out[b, h, i] = total / Hq
    return out


def test_the_per_token_mean_equals_its_naive_reference_and_the_slot_mean_when_heads_agree():
    g = torch.Generator().manual_seed(0)
    B, Hkv, groups, n, seen = 2, 3, 2, 5, 9
    positions = torch.stack(
        [torch.stack([torch.randperm(seen, generator=g)[:n].sort().values for _ in range(Hkv)]) for _ in range(B)]
    )
    valid = torch.ones(B, Hkv, n, dtype=torch.bool)
    valid[1, :, 0] = False  # a padded slot in every head of row 1
    probs = torch.rand(B, Hkv * groups, n, generator=g).masked_fill(~valid.repeat_interleave(groups, 1), 0.0)
    got = held_token_mean(probs, positions, valid, seen)
    assert torch.allclose(got, naive_held_token_mean(probs, positions, valid), atol=1e-7)
    same = positions[:, :1].expand(-1, Hkv, -1)
    assert torch.allclose(held_token_mean(probs, same, valid, seen), probs.mean(1, keepdim=True).expand(-1, Hkv, -1))


def prefill_positions(family: str, strategy: Strategy) -> list[torch.Tensor]:
    """Each layer's positions ``[B, Hkv, n]`` right after the prompt (runtime_and_oracle's model and batch)."""
    model = tiny_model(family, layers=2, seed=4)
    ids, mask = batch(seed=5, n=PROMPT, pad=4)
    with apply_strategy(model, strategy), torch.no_grad():
        return [layer.positions.clone() for layer in model(ids, attention_mask=mask, use_cache=True).cache.layers]


TOVA = LayerChoice("tova", 14)
EVIDENCE = LayerChoice("evidence", 14, {"rule": "tova", "share": 0.5, "window": 4})
CASES = [*((f, TOVA) for f in FAMILIES), ("llama", EVIDENCE)]


@pytest.mark.parametrize("family,decoding", CASES, ids=[f"{c.pattern}-{f}" for f, c in CASES])
def test_tova_after_a_per_head_prefill_keeps_the_oracles_tokens(family, decoding):
    strategy = Strategy([SNAPKV] * 2, [decoding] * 2, global_budget=16, b_min=1)
    cache, oracle = runtime_and_oracle(family, strategy, steps=3)
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"{family}: layer {layer} row {b} head {h}"
    prefilled = prefill_positions(family, strategy)  # the case under test: heads that hold different tokens
    assert any(not torch.equal(p, p[:, :1].expand_as(p)) for p in prefilled)


def test_tova_from_the_prompt_on_still_shares_one_selection_across_heads():
    strategy = Strategy([LayerChoice("tova", 16)] * 2, [LayerChoice("tova", 10)] * 2, global_budget=16, b_min=1)
    cache, oracle = runtime_and_oracle("llama", strategy, steps=6)
    for layer in cache.layers:
        assert torch.equal(layer.positions, layer.positions[:, :1].expand_as(layer.positions))
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"layer {layer} row {b} head {h}"
