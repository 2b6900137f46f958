"""The query-agnostic patterns of issue 26 against their papers' closed forms (kvpress's formulas),
beside the registry-wide kept-set tests (tests/test_runtime.py, tests/test_row_batch.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from polykv_search.patterns import make_pattern
from polykv_search.patterns.state import PatternState
from polykv_search.runtime import FULL_PLAN, EvictingLayer, apply_strategy, model_spec
from strategies import Strategy
from tests.oracle import Oracle
from tests.test_runtime import batch, kept_sets, run_three_steps
from tests.tiny import rope, tiny_model

H, G, D = 2, 2, 8
KW = {"num_kv_heads": H, "groups": G, "scaling": D**-0.5}


def _layer(keys: torch.Tensor, values: torch.Tensor, **kw) -> EvictingLayer:
    layer = EvictingLayer(0, FULL_PLAN, FULL_PLAN, **KW, **kw)
    layer.update(keys, values)
    return layer


def test_keydiff_is_minus_the_cosine_to_the_mean_unit_key():
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(2, H, 15, D, generator=gen) * torch.rand(2, H, 15, 1, generator=gen) * 3
    layer = _layer(keys, torch.randn(2, H, 15, D, generator=gen))
    anchor = F.normalize(keys, p=2, dim=-1).mean(dim=2, keepdim=True)
    want = -F.cosine_similarity(keys, anchor, dim=-1)
    torch.testing.assert_close(make_pattern("keydiff").score(layer, PatternState()), want, rtol=1e-5, atol=1e-6)


def test_keydiff_anchor_ignores_padding():
    gen = torch.Generator().manual_seed(1)
    keys = torch.randn(1, H, 12, D, generator=gen)
    padded = _layer(keys, torch.randn(1, H, 12, D, generator=gen))
    padded.valid = padded.valid.clone()
    padded.valid[..., :4] = False  # left padding: its keys must not move the anchor
    alone = _layer(keys[..., 4:, :].clone(), torch.randn(1, H, 8, D, generator=gen))
    got = make_pattern("keydiff").score(padded, PatternState())[..., 4:]
    torch.testing.assert_close(got, make_pattern("keydiff").score(alone, PatternState()), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ expected attention
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _kvpress_scores(pre, keys, values, n_sink, n_future, rotary):
    """kvpress 0.5's ExpectedAttentionPress formula, written from its docstring: statistics of the
    pre-RoPE queries ``pre`` ``[B, Hq, n, D]`` past the sinks, averaged future rotation, expected
    attention over the non-sink keys, group mean, value norm; the sinks are left out (kept anyway)."""
    b, hq, n, d = pre.shape
    q = pre[:, :, n_sink:].double()
    mu = q.mean(dim=2)
    centered = q - mu[:, :, None]
    cov = torch.einsum("bhsi,bhsj->bhij", centered, centered) / q.shape[2]
    cos, sin = (t.double() for t in rotary(range(n, n + n_future)))
    eye = torch.eye(d, dtype=torch.float64)
    perm = torch.zeros(d, d, dtype=torch.float64)
    perm[d // 2 :, : d // 2], perm[: d // 2, d // 2 :] = torch.eye(d // 2), -torch.eye(d // 2)
    rot = (cos[:, None] * eye + sin[:, None] * perm).mean(0)
    mu, cov = mu @ rot.T, rot @ cov @ rot.T
    k = keys[:, :, n_sink:].double().repeat_interleave(hq // keys.shape[1], dim=1)
    logits = torch.einsum("bhd,bhnd->bhn", mu, k) / d**0.5 + torch.einsum("bhnd,bhde,bhne->bhn", k, cov, k) / d / 2
    probs = logits.softmax(-1).view(b, keys.shape[1], hq // keys.shape[1], -1).mean(2)
    return probs * values[:, :, n_sink:].double().norm(dim=-1)


def _observed(n: int, seed: int, rotary, **kw):
    """A layer holding ``n`` random post-RoPE keys, with the pattern's hooks run on ``n`` queries."""
    gen = torch.Generator().manual_seed(seed)
    pre = torch.randn(1, H * G, n, D, generator=gen) + torch.randn(1, H * G, 1, D, generator=gen)
    cos, sin = rotary(range(n))
    layer = _layer(torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen), rotary=rotary)
    pattern, state = make_pattern("expected_attention", **kw), PatternState()
    layer.attention_call(_rotate(pre, cos, sin), None, finish=False)  # no observers: run the hook ourselves
    pattern.pre_kernel(layer, state, _rotate(pre, cos, sin))
    return layer, pattern, state, pre


def test_expected_attention_is_kvpress_formula_on_the_prompt():
    rotary = rope(D, base=50.0)  # fast-turning pairs: the rotation matters
    layer, pattern, state, pre = _observed(40, 0, rotary, n_future_positions=64)
    want = _kvpress_scores(pre, layer.keys, layer.values, 4, 64, rotary)
    got = pattern.score(layer, state)
    torch.testing.assert_close(got[..., 4:].double(), want, rtol=2e-4, atol=1e-7)
    assert (got[..., :4] == 0).all()
    keep = pattern.cache_update(layer, state, 12)
    assert keep[..., :4].tolist() == [[[0, 1, 2, 3]] * H]  # the sinks are kept


def test_expected_attention_running_sums_equal_one_pass_over_all_queries():
    rotary = rope(D, base=50.0)
    whole, pattern, state, pre = _observed(30, 1, rotary)
    steps = EvictingLayer(0, FULL_PLAN, FULL_PLAN, **KW, rotary=rotary)
    stepped = PatternState()
    cos, sin = rotary(range(30))
    post = _rotate(pre, cos, sin)
    for lo, hi in ((0, 22), (22, 23), (23, 27), (27, 30)):  # a prompt, then decoding calls
        steps.update(whole.keys[..., lo:hi, :], whole.values[..., lo:hi, :])
        steps.attention_call(post[..., lo:hi, :], None, finish=False)
        pattern.pre_kernel(steps, stepped, post[..., lo:hi, :])
    for name, tensor in state.row.items():
        tol = 1e-6 if tensor.dtype == torch.float32 else 1e-9  # the centered sums are fp32
        torch.testing.assert_close(stepped.row[name], tensor, rtol=tol, atol=tol * float(tensor.abs().max()))
    torch.testing.assert_close(pattern.score(steps, stepped), pattern.score(whole, state))


def test_expected_attention_needs_the_models_rope_and_checks_its_parameters():
    layer = _layer(torch.randn(1, H, 6, D), torch.randn(1, H, 6, D))
    with pytest.raises(RuntimeError, match="no rotary embedding"):
        make_pattern("expected_attention").pre_kernel(layer, PatternState(), torch.randn(1, H * G, 6, D))
    for bad in ({"n_future_positions": 0}, {"n_sink": -1}, {"use_covariance": 1}, {"epsilon": -0.1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_pattern("expected_attention", **bad)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_runtime_wires_the_models_own_rope(family):
    model = tiny_model(family, layers=1)
    rotary = model_spec(model).rotary
    pos = torch.arange(3, 40)[None]
    cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float32), pos)
    got = rotary(range(3, 40))
    assert torch.equal(got[0], cos[0]) and torch.equal(got[1], sin[0])
    with apply_strategy(model, Strategy.uniform(1, "expected_attention", 8)) as rt:
        wired = rt.new_cache().layers[0].rotary_cos_sin(range(3, 40))  # what every runtime layer reads
    assert torch.equal(wired[0], cos[0]) and torch.equal(wired[1], sin[0])


@pytest.mark.parametrize("pattern", ["expected_attention", "keydiff"])
def test_qwen3_keeps_the_reference_token_set(pattern):
    """Qwen3's q/k norms sit before RoPE: the queries the pattern un-rotates are the normed ones."""
    model = tiny_model("qwen3", layers=2, seed=4)
    strategy = Strategy.uniform(2, pattern, 10)
    ids, mask = batch(seed=5, n=30, pad=4)
    cont = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(6))
    with apply_strategy(model, strategy):
        _, cache = run_three_steps(model, strategy, ids, mask, cont, steps=5)
    with Oracle(model, strategy) as oracle:
        run_three_steps(model, strategy, ids, mask, cont, steps=5)
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"{pattern}: layer {layer} row {b} head {h}"
