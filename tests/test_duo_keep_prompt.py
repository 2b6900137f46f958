"""``duo[keep=prompt]``: the retrieval heads keep the whole prompt for good and the newest ``recent`` tokens, at
a budget a long generation cannot outgrow (a decoding plan that keeps the prompt's facts, docs/decode.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from solvers import Problem, SolverError, get_solver
from solvers.duo import prompt_share
from tests.head_tables import table_with_heads
from tests.tiny import tiny_model

N = 24  # the prompt (the table's context length)


def labels(strategy, phase: str) -> list[list[str]]:
    return [[g.label() for g in strategy.head_groups(layer, phase)] for layer in range(strategy.num_layers)]


def test_the_retrieval_heads_keep_the_prompt_and_a_recent_window_by_hand():
    # N = 6 heads, T = 3 * floor(2 * 64) = 384, n = 256, recent 16: b = 272; floor f = 4 + 12 = 16:
    # k = (384 - 6*16) // (272 - 16) = 1; s = (384 - 272) // 5 = 22
    scores = np.array([[0.5, 0.1, 0.0], [0.9, 0.0, 0.2]])
    table = table_with_heads(2, 3, cells=False, context_len=256, scores=scores)
    result = get_solver("duo", min_recent=12, keep="prompt", recent=16).solve(
        Problem(global_budget=64, table=table, b_min=8)
    )
    s = result.strategy
    kept = "evidence[rule=streaming_llm,share=0.926471]@272[0]"
    assert (
        labels(s, "prefill") == labels(s, "decoding") == [["streaming_llm@22[0,1,2]"], [kept, "streaming_llm@22[1,2]"]]
    )
    assert math.floor(0.926471 * 272) == 252  # the prompt past streaming_llm's 4 sinks
    assert s.provenance["duo"]["keep"] == "prompt" and s.provenance["duo"]["retrieval_head_budget"] == 272
    default = get_solver("duo", min_recent=12).solve(Problem(global_budget=64, table=table, b_min=8)).strategy
    assert labels(default, "decoding")[1][0] == "full@256[0]"  # keep=all (the default) is DuoAttention's


@pytest.mark.parametrize(("n", "recent"), [(256, 16), (512, 64), (1024, 1), (7, 3), (100_000, 64)])
def test_the_prompt_share_holds_exactly_the_prompt(n, recent):
    share = prompt_share(n, recent)
    assert 0 < share < 1 and math.floor(share * (n + recent)) == n - 4  # streaming_llm keeps its 4 sinks itself


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"keep": "everything"}, r"keep: must be one of all, prompt, got 'everything'"),
        ({"recent": 0}, "recent: must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(settings, message):
    with pytest.raises(SolverError, match=message):
        get_solver("duo", **settings)


def test_a_long_generation_never_pushes_the_prompt_out_of_a_retrieval_head():
    """48 generated tokens through budget N + 6: the two retrieval heads (B = 20 affords k = 2: 2 * 30 + 2 * 10 = 80
    = 2 * floor(2 * 20)) hold every prompt position and the newest 6 (what the docstring says, written out), the
    streaming heads their budget of 10."""
    from polykv_search.runtime import apply_strategy

    model = tiny_model("llama", layers=2, seed=3)  # 2 KV heads per layer
    scores = np.array([[0.9, 0.0], [0.0, 0.8]])
    table = table_with_heads(2, 2, cells=False, context_len=N, scores=scores)
    strategy = (
        get_solver("duo", n_sink=2, min_recent=4, keep="prompt", recent=6)
        .solve(Problem(global_budget=20, table=table, b_min=4))
        .strategy
    )
    ids = torch.randint(1, 128, (1, N), generator=torch.Generator().manual_seed(1))
    with apply_strategy(model, strategy), torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache, token = out.cache, out.logits[:, -1:].argmax(-1)
        for _ in range(48):
            out = model(input_ids=token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
    seen = N + 48
    for layer, head in ((0, 0), (1, 1)):
        held = held_positions(cache, layer, head)
        want = set(range(N)) | set(range(seen - 6, seen))
        assert held == want, (layer, head, sorted(held - want), sorted(want - held))
    stream = strategy.head_groups(0, "decoding")[-1].budget
    assert stream == 10 and [g.budget for g in strategy.head_groups(1, "decoding")] == [10, N + 6]
    assert len(held_positions(cache, 0, 1)) == stream and len(held_positions(cache, 1, 0)) == stream


def held_positions(cache, layer: int, head: int) -> set[int]:
    for cell, heads in cache.layers[layer].cells():
        which = list(range(cell.positions.shape[1])) if heads is None else list(heads)
        if head in which:
            i = which.index(head)
            return set(cell.positions[0, i][cell.valid[0, i]].tolist())
    raise AssertionError(f"no cell holds head {head} of layer {layer}")
