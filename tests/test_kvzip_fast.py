"""kvzip's fast scoring: the reconstruction pass's kernel hands its log-sum-exp to the pattern, which then
needs only the prompt's logits (no second softmax over the whole cache).

The kernel's output is SDPA's own, bit for bit; the scores equal the softmax path's (the one the oracle
tests of tests/test_kvzip.py check) to float rounding, with the same kept sets."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import kvzip as kvzip_mod
from polykv_search.runtime import apply_strategy
from polykv_search.runtime import view as kernels
from strategies import Strategy
from tests.test_runtime import batch
from tests.tiny import FAMILIES, tiny_model


def _masks(b, h, q, n, gen):
    qpos, kpos = torch.arange(n - q, n), torch.arange(n)
    shared = (kpos[None, :] <= qpos[:, None])[None, None]  # [1, 1, q, n]: a pass call without padding
    valid = torch.rand(b, h, n, generator=gen) > 0.3  # per row and head, as after padding or eviction
    per_head = (shared & valid[:, :, None, :]) | (kpos == qpos[:, None])
    return {"shared": shared, "per_head": per_head}


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("kind", ["shared", "per_head"])
def test_the_pass_kernel_is_sdpa_bit_for_bit_and_its_lse_the_logits(groups, kind):
    gen = torch.Generator().manual_seed(groups)
    b, h, q, n, d = 2, 2, 37, 90, 16
    query = torch.randn(b, h * groups, q, d, generator=gen)
    key, value = torch.randn(b, h, n, d, generator=gen), torch.randn(b, h, n, d, generator=gen)
    mask = _masks(b, h, q, n, gen)[kind]
    got = kernels.flash_with_lse(query, key, value, mask, 0.25)
    assert got is not None  # CPU, float32: SDPA's flash kernel
    out, lse = got
    assert torch.equal(out, kernels.kernel("sdpa", query, key, value, mask, 0.25))
    logits = query.view(b, h, groups, q, d) @ key[:, :, None].transpose(-1, -2) * 0.25
    logits = logits.masked_fill(~mask[:, :, None], float("-inf")).view(b, h * groups, q, n)
    torch.testing.assert_close(lse, torch.logsumexp(logits, dim=-1), rtol=1e-5, atol=1e-5)


def test_the_pass_kernel_steps_aside_where_sdpa_would_not_run_it():
    query, key = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8)
    mask = torch.ones(1, 1, 4, 6, dtype=torch.bool)
    assert kernels.flash_with_lse(query, key, key, None, 1.0) is None  # no mask: not a pass call
    assert kernels.flash_with_lse(query, key, key, mask.float(), 1.0) is None  # not a bool mask


def _run(model, strategy, ids, mask, *, fast: bool, monkeypatch):
    calls = {"lse": 0, "probs": 0}
    for name in calls:
        real = getattr(kvzip_mod.KVzip, f"_from_{name}")

        def spy(self, *args, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, *args)

        monkeypatch.setattr(kvzip_mod.KVzip, f"_from_{name}", spy)
    if not fast:
        monkeypatch.setattr(kernels, "flash_with_lse", lambda *args: None)
    with torch.no_grad(), apply_strategy(model, strategy) as rt:
        out = model(ids, attention_mask=mask, use_cache=True)
        assert "kernel" not in vars(rt)  # the pass put the runtime's own kernel back
    assert not hasattr(kvzip_mod, "_KERNEL_LSE")  # the log-sum-exp is an argument, never module state
    monkeypatch.undo()
    layers = out.cache.layers
    kept = [layer.positions.tolist() for layer in layers]
    scores = [next(iter(layer.states.values())).token["kvzip"] for layer in layers]
    return out.logits, kept, scores, calls


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_scores_from_the_kernel_lse_equal_the_softmax_path(family, padded, monkeypatch):
    model = tiny_model(family, layers=3, seed=21)
    ids, mask = batch(seed=22, n=40, pad=6)
    mask = mask if padded else None
    strategy = Strategy.uniform(3, "kvzip", 12, params={"chunk_size": 16, "query_chunk": 7})
    logits, kept, scores, calls = _run(model, strategy, ids, mask, fast=True, monkeypatch=monkeypatch)
    ref_logits, ref_kept, ref_scores, ref_calls = _run(model, strategy, ids, mask, fast=False, monkeypatch=monkeypatch)
    assert calls == {"lse": 3 * 3, "probs": 0} and ref_calls == {"lse": 0, "probs": 3 * 3}  # 3 layers, 3 chunks
    assert torch.equal(logits, ref_logits)  # the prefill forward is untouched
    assert kept == ref_kept
    for got, want in zip(scores, ref_scores):
        assert torch.equal(got == 0, want == 0)  # padding slots stay zero
        torch.testing.assert_close(got, want, rtol=2e-6, atol=0.0)


def test_a_sliding_window_masks_the_prompt_keys_it_hides(monkeypatch):
    model = tiny_model("mistral", layers=2, seed=5, sliding_window=24)  # pass queries see only part of the prompt
    ids, _ = batch(seed=6, n=40, pad=0)
    strategy = Strategy.uniform(2, "kvzip", 12, params={"chunk_size": 16})
    _, kept, scores, calls = _run(model, strategy, ids, None, fast=True, monkeypatch=monkeypatch)
    _, ref_kept, ref_scores, _ = _run(model, strategy, ids, None, fast=False, monkeypatch=monkeypatch)
    assert calls["lse"] == 2 * 3 and kept == ref_kept
    for got, want in zip(scores, ref_scores):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=0.0)


def test_an_eager_model_scores_from_the_probabilities(monkeypatch):
    model = tiny_model("llama", attn="eager", layers=2, seed=7)
    ids, mask = batch(seed=8, n=30, pad=4)
    _, _, _, calls = _run(model, Strategy.uniform(2, "kvzip", 10), ids, mask, fast=True, monkeypatch=monkeypatch)
    assert calls == {"lse": 0, "probs": 2}
