"""The runtime on the real default model (SmolLM2-135M, offline): slow tests."""

from __future__ import annotations

import pytest
import torch

from polykv_search.generation import encode_prompt, generate
from polykv_search.models import load_model
from strategies import LayerChoice, Strategy

pytestmark = pytest.mark.slow

PASSAGE = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be "
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families, that he is considered the rightful property of some one or other of "
    "their daughters. "
)


@pytest.fixture(scope="module")
def smollm2():
    return load_model()


@pytest.mark.smoke
def test_mixed_strategy_generates_text_and_holds_cache_lengths(smollm2):
    model, tok = smollm2
    L = model.config.num_hidden_layers
    patterns = ["snapkv", "tova", "h2o", "streaming_llm", "pyramidkv", "knorm"]
    budgets = [48, 96, 64, 128, 80, 32]
    prefill = [LayerChoice(patterns[i % 6], budgets[i % 6]) for i in range(L)]
    decoding = [LayerChoice(patterns[(i + 1) % 6], budgets[(i + 2) % 6]) for i in range(L)]
    strategy = Strategy(prefill, decoding, global_budget=75, b_min=32)
    ids = encode_prompt(tok, PASSAGE * 12 + "\nWhat does a single man with a fortune want?", chat=True)
    assert 900 <= ids.shape[1] <= 1100
    result = generate(model, tok, ids, strategy, max_new_tokens=12)
    assert result.text.strip()
    assert result.after_prefill.lengths == [c.budget for c in prefill]
    steps = len(result.new_tokens) - 1  # decoding calls after the prefill
    # a layer grows from its prefill budget up to its decoding budget, then evicts every step
    assert result.at_end.lengths == [min(d.budget, p.budget + steps) for p, d in zip(prefill, decoding)]
    bpt = 2 * 3 * 64 * 4  # K+V, 3 KV heads, head_dim 64, fp32
    assert result.at_end.kv_bytes == sum(result.at_end.lengths) * bpt
    assert result.at_end.kv_bytes < 0.15 * result.at_end.full_kv_bytes


def test_fullkv_runtime_matches_plain_generate(smollm2):
    model, tok = smollm2
    ids = encode_prompt(tok, PASSAGE * 4 + "\nSummarize in one sentence.", chat=True)
    with torch.no_grad():
        plain = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1] :].tolist()
    result = generate(model, tok, ids, Strategy.full(model.config.num_hidden_layers), max_new_tokens=16)
    assert result.new_tokens == plain[: len(result.new_tokens)]
