"""KVzip+'s normalization (``kvzip[plus=true]``, kvpress's ``KVzipPress(kvzip_plus_normalization=True)``): a pass
query's attention to a prompt token, through query head ``j``, weighed by ``||v W_o[j]|| / ||x||`` before the
maximum; by hand on a small tensor, against the oracle through the runtime (its reconstruction pass hands
``reconstruct`` the attention modules' inputs), on the shared scoring engine as on the per-entry one, through the
strategy JSON and the kvpress export. The collector's replay of kvzip+ cells: ``tests/test_collect.py`` (layer
cells) and ``tests/test_head_cells.py`` (a head cell, its group's share of ``o_proj``)."""

from __future__ import annotations

import pytest
import torch

from polykv_search.patterns import canonical_spec, make_pattern
from polykv_search.patterns.base import PassInputs
from polykv_search.patterns.kvzip import KVzip
from polykv_search.patterns.state import PatternState
from polykv_search.runtime import apply_strategy
from polykv_search.scoring import Entry
from strategies import HeadGroup, LayerChoice, Strategy
from strategies.kvpress_presses import prefill_press
from tests.oracle import Oracle
from tests.test_eval_support import char_tokenizer
from tests.test_kvzip_pooled import held, oracle_held
from tests.test_runtime import batch, kept_sets, run_three_steps
from tests.test_scoring_engines import assert_same, jobs
from tests.test_scoring_head_groups import run_both as run_both_engines
from tests.tiny import tiny_model


class TinyView:
    """One row, one KV head of 2 query heads, keys and values of 2 dimensions: the prompt's 2 tokens and the
    pass's 2 so far, every query causal over them (all that ``reconstruct`` reads)."""

    layer_idx, num_kv_heads, scaling, sliding_window, all_valid = 0, 1, 1.0, None, True

    def __init__(self, keys, values):
        self.keys, self.values = keys, values
        self.valid = torch.ones(keys.shape[:3], dtype=torch.bool)
        self.query_range = range(2, 4)

    def allowed(self, query_positions):
        return (torch.arange(4)[None, :] <= torch.as_tensor(list(query_positions))[:, None])[None, None]

    def query_valid(self, q_len):
        return None

    def repeat_heads(self, t):
        return t.repeat_interleave(2, dim=1)

    def logits(self, query):
        scores = query @ self.repeat_heads(self.keys).transpose(-1, -2) * self.scaling
        return scores.masked_fill(~self.allowed(self.query_range), float("-inf"))

    def attention_probs(self, query, query_positions, upto=None):
        return self.logits(query).softmax(-1)


def hand_case():
    """Zero queries attend uniformly: the pass's first query (position 2) 1/3 to each key it sees, the second
    (position 3) 1/4. Values v0 = (1, 0), v1 = (0, 2); head 0 writes v, head 1 writes (3 v[0], 0); the
    queries' input hidden states have norms 3 and 1."""
    keys = torch.tensor([[[[0.5, 1.0], [1.0, -1.0], [2.0, 0.0], [0.0, 3.0]]]])
    values = torch.tensor([[[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0], [1.0, 1.0]]]])
    out_proj = torch.stack([torch.eye(2), torch.tensor([[3.0, 0.0], [0.0, 0.0]])])  # [Hq, Dv, hidden]
    inputs = PassInputs(hidden_norm=torch.tensor([[3.0, 1.0]]), out_proj=out_proj)
    return TinyView(keys, values), torch.zeros(1, 2, 2, 2), inputs


@pytest.mark.parametrize("path", ["lse", "probs"])
def test_plus_scores_equal_a_hand_computation(path):
    view, query, inputs = hand_case()
    lse = torch.logsumexp(view.logits(query), dim=-1) if path == "lse" else None
    # token 0: head 0 gives (1/3)*1/3 and (1/4)*1/1, head 1 (1/3)*3/3 and (1/4)*3/1: the max is 3/4
    # token 1: head 0 gives (1/3)*2/3 and (1/4)*2/1, head 1 writes nothing of it: the max is 1/2
    plus, plain = PatternState(), PatternState()
    KVzip(plus=True).reconstruct(view, plus, query, 2, lse, inputs)
    KVzip().reconstruct(view, plain, query, 2, lse)
    torch.testing.assert_close(plus.token["kvzip"], torch.tensor([[[3 / 4, 1 / 2]]]))
    torch.testing.assert_close(plain.token["kvzip"], torch.tensor([[[1 / 3, 1 / 3]]]))  # max(1/3, 1/4)


def test_plus_without_the_pass_inputs_refuses_in_one_line():
    view, query, _ = hand_case()
    assert KVzip(plus=True).needs_pass_inputs and not KVzip().needs_pass_inputs
    with pytest.raises(RuntimeError, match=r"kvzip\[plus=true\] \(layer 0\) needs the pass's hidden-state norms"):
        KVzip(plus=True).reconstruct(view, PatternState(), query, 2, None)
    with pytest.raises(ValueError, match="plus must be true or false, got 1"):
        make_pattern("kvzip", plus=1)


def run_both(family, strategy):
    """The oracle's kept sets, then the runtime's (its pass hands kvzip the inputs itself), on a left-padded batch."""
    model = tiny_model(family, layers=3, seed=5)
    ids, mask = batch(seed=6, n=30, pad=5)
    cont = torch.randint(1, 128, (2, 4), generator=torch.Generator().manual_seed(7))
    with Oracle(model, strategy) as oracle:
        run_three_steps(model, strategy, ids, mask, cont, steps=5)
    with apply_strategy(model, strategy):
        _, cache = run_three_steps(model, strategy, ids, mask, cont, steps=5)
    return cache, oracle


def plus_strategy(budgets, allocation: str, plus: bool = True) -> Strategy:
    params = {"plus": plus, "n_sink": 2, "allocation": allocation}
    choices = [LayerChoice("kvzip", b, params) for b in budgets]
    return Strategy(choices, choices, global_budget=sum(budgets) / len(budgets), b_min=1)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_plus_per_head_keeps_the_oracles_tokens_through_prefill_and_decoding(family):
    cache, oracle = run_both(family, plus_strategy([9, 12, 10], "head"))
    for layer, b, h, got, want in kept_sets(cache, oracle):
        assert got == want, f"layer {layer} row {b} head {h}"


def test_plus_in_a_model_pool_ranks_its_scores_across_layers_as_the_oracle_does():
    cache, oracle = run_both("llama", plus_strategy([14, 18, 16], "model"))
    got = held(cache)
    assert got == oracle_held(oracle, cache)
    assert len({len(v) for v in got.values()}) > 1, "the heads should hold different numbers of tokens"


def test_plus_round_trips_through_the_strategy_json_and_exports_to_kvzip_plus(tmp_path):
    assert canonical_spec("kvzip[plus=true,allocation=model]") == "kvzip[plus=true,allocation=model]"
    assert canonical_spec("kvzip[plus=false]") == "kvzip"
    s = plus_strategy([9, 12, 10], "layer")
    back = Strategy.load(s.save(tmp_path / "s.json"))
    assert back.to_json() == s.to_json() and back.prefill[0].params["plus"] is True
    press = prefill_press(s.prefill[0])
    assert press is not None and press.params == {"layerwise": True, "n_sink": 2, "kvzip_plus_normalization": True}
    plain = prefill_press(LayerChoice("kvzip", 9, {}))
    assert plain is not None and plain.params == {"layerwise": True, "n_sink": 4}


def plus_entries() -> list[Entry]:
    """KVzip+ on the scoring engines: per head, pooled over the model, in one KV head's group (its share of
    ``o_proj``), in decoding only, beside plain kvzip (the same pass, other scores) and an entry without a pass."""
    plus = {"plus": True, "n_sink": 2}
    group = LayerChoice.grouped([HeadGroup((0,), "full", 4096), HeadGroup((1,), "kvzip", 14, plus)])
    heads = Strategy([group] * 3, [group] * 3, global_budget=None, context_len=4096, num_kv_heads=2)
    snapkv, decoding = [LayerChoice("snapkv", 30)] * 3, [LayerChoice("kvzip", 20, plus)] * 3
    return [
        Entry("full", Strategy.full(3), "baseline", "full"),
        Entry("plus", plus_strategy([20, 20, 20], "head"), "strategy", "p"),
        Entry("plus-model", plus_strategy([24, 20, 28], "model"), "strategy", "m"),
        Entry("plus-heads", heads, "strategy", "h"),
        Entry("plus-decoding", Strategy.from_choices(snapkv, decoding, None), "strategy", "d"),
        Entry("kvzip", plus_strategy([20, 20, 20], "head", plus=False), "strategy", "k"),
        Entry("snapkv", Strategy.uniform(3, "snapkv", 24), "baseline", "snapkv"),
    ]


@pytest.mark.parametrize("kind", ["teacher_forced", "generate"])
def test_shared_engine_scores_plus_entries_as_the_per_entry_engine(kind):
    model, tok = tiny_model("qwen3"), char_tokenizer()
    forced, gen = jobs(tok)
    job = forced if kind == "teacher_forced" else gen
    reference, shared = run_both_engines(model, plus_entries(), job)
    assert_same(reference, shared, job)
    if job.teacher_forced:  # the weights change the kept tokens: plus is not plain kvzip at the same budgets
        assert not torch.equal(reference[1].logits, reference[5].logits)


def counted_hooks(monkeypatch, model) -> list:
    """The forward pre-hooks registered on ``model``'s attention modules from now on (their handles)."""
    hooks: list = []

    def counted(real):
        def register(*args, **kwargs):
            hooks.append(real(*args, **kwargs))
            return hooks[-1]

        return register

    for module in (layer.self_attn for layer in model.model.layers):
        monkeypatch.setattr(module, "register_forward_pre_hook", counted(module.register_forward_pre_hook))
    return hooks


def test_generate_with_plus_decodes_as_its_forward_calls_and_only_its_pass_hooks_the_attention(monkeypatch):
    model = tiny_model("llama", layers=3, seed=5)
    ids = torch.randint(1, 128, (2, 30), generator=torch.Generator().manual_seed(6))
    hooks = counted_hooks(monkeypatch, model)
    with torch.no_grad(), apply_strategy(model, plus_strategy([9, 12, 10], "head", plus=False)):
        model(ids, use_cache=True)
    assert hooks == []  # plain kvzip's pass reads no pass inputs: no hook, no cost
    with torch.no_grad(), apply_strategy(model, plus_strategy([9, 12, 10], "head")) as rt:
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert len(hooks) == 3 and not any(layer.self_attn._forward_pre_hooks for layer in model.model.layers)
        assert [r.kept for r in rt.report().layers] == [9, 12, 10]
        step = model(ids, use_cache=True)
        tokens = [step.logits[:, -1:].argmax(-1)]
        for _ in range(3):
            step = model(tokens[-1], cache=step.cache, use_cache=True)
            tokens.append(step.logits[:, -1:].argmax(-1))
    assert out[:, 30:].tolist() == torch.cat(tokens, 1).tolist()
