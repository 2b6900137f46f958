"""`--format kvpress` with head groups: per-KV-head key masks, refusals, --approximate, DuoAttentionPress."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from test_export_kvpress_routing import fake_kvpress

from polykv_search.cli import main
from polykv_search.runtime import apply_strategy
from strategies import HeadGroup, LayerChoice, Strategy
from strategies.exporters import ExportError, render_export
from tests.tiny import tiny_model


def grouped(*groups) -> LayerChoice:
    return LayerChoice.grouped(HeadGroup(*g) for g in groups)


def duo(n_sink: int = 2, budget: int = 6, context_len: int = 20) -> Strategy:
    """Duo-shaped, 2 layers x 2 KV heads: layer 0 head 1 keeps all, the other heads stream (layer 1 at layer level)."""
    g = grouped(((1,), "full", context_len), ((0,), "streaming_llm", budget, {"n_sink": n_sink}))
    s = LayerChoice("streaming_llm", budget, {"n_sink": n_sink})
    return Strategy([g, s], [g, s], 11, 4, {"solver": "duo"}, context_len=context_len, num_kv_heads=2)


def headkv(decoding_snapkv: bool = True) -> Strategy:
    """Per-head snapkv budgets (headkv-shaped); decoding the same, or full heads."""
    g = grouped(((0,), "snapkv", 10, {"window": 4}), ((1,), "snapkv", 4, {"window": 4}))
    d = g if decoding_snapkv else grouped(((0, 1), "full", 20))
    return Strategy([g, g], [d, d], 20, 4, {"solver": "headkv"}, context_len=20, num_kv_heads=2)


def kvpress_with_heads(calls: list):
    """The routing tests' stand-in kvpress, plus DuoAttentionPress and a deterministic ``score``."""
    kv = fake_kvpress(calls)

    @dataclass
    class DuoAttentionPress(kv.BasePress):
        head_compression_ratio: float = 0.0
        sink_size: int = field(init=False, default=None)
        recent_size: int = field(init=False, default=None)
        streaming_mask: object = field(init=False, default=None)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        calls.append(("score", module.layer_idx, type(self).__name__))
        n = keys.shape[2]
        return torch.stack([torch.arange(n, 0, -1.0), torch.arange(n) * 7 % 16.0])[None]  # head 0: oldest first

    kv.DuoAttentionPress = DuoAttentionPress
    kv.ScorerPress.score = score
    return kv


def hook_call(press, module, length: int, q: int, heads: int = 2):
    """One attention call of ``q`` new tokens into a cache of ``length`` tokens, through the press's hook."""
    keys = torch.zeros(1, heads, length, 4)
    kwargs = {
        "past_key_values": SimpleNamespace(layers={module.layer_idx: SimpleNamespace(keys=keys, values=keys)}),
        "cache_position": torch.arange(length - q, length),
        "hidden_states": torch.zeros(1, q, 8),
    }
    press.forward_hook(module, [], kwargs, (None, None))


def load_press_module(path, monkeypatch, calls: list):
    monkeypatch.setitem(sys.modules, "kvpress", kvpress_with_heads(calls))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def visible_positions(module, head: int) -> list[int]:
    return module.polykv_visible[0, head].nonzero().flatten().tolist()


# ------------------------------------------------------------------------------ the exported files
def test_a_duo_shaped_strategy_exports_head_masks_and_a_duo_attention_press(tmp_path):
    out = tmp_path / "duo_press.py"
    export = render_export(duo(), "kvpress", out)
    text = export.files[out]
    assert export.warnings == []
    assert "import kvpress\nimport torch\n" in text
    assert (
        "PREFILL = [\n    None,  # layer 0: head groups (HEAD_GROUPS)\n"
        "    ('StreamingLLMPress', {'n_sink': 2}, 6),  # layer 1: streaming_llm(n_sink=2) budget 6\n]"
    ) in text
    assert (
        "HEAD_GROUPS = [\n    {\n        'prefill': [\n"
        "            ((1,), 'full', {}, None),  # full\n"
        "            ((0,), 'streaming', {'n_sink': 2}, 6),  # streaming_llm(n_sink=2) budget 6\n"
        "        ],\n        'decoding': [\n"
        "            ((1,), 'full', {}, None),  # full\n"
        "            ((0,), 'streaming', {'n_sink': 2}, 6),  # streaming_llm(n_sink=2) budget 6\n"
        "        ],\n    },  # layer 0\n"
        "    None,  # layer 1: layer-level (PREFILL, DECODING)\n]"
    ) in text
    assert "DUO_ATTENTION = {'sink_size': 2, 'recent_size': 4, 'streaming': [[True, False], [True, True]]}" in text
    compile(text, str(out), "exec")
    side = json.loads(export.files[tmp_path / "duo_press.json"])
    assert side["duo_attention"] == {"sink_size": 2, "recent_size": 4, "streaming": [[True, False], [True, True]]}
    assert side["layers"][0]["prefill"]["head_groups"][1] == {
        "heads": [0],
        "strategy": "streaming_llm(n_sink=2) budget 6",
        "kvpress": {"mask": "streaming", "params": {"n_sink": 2}, "budget": 6},
        "differences": [],
    }
    assert side["layers"][1]["prefill"]["kvpress"] == {"class": "StreamingLLMPress", "params": {"n_sink": 2}}
    assert any("save no memory" in n for n in export.notes)
    assert any("flash_attention_2" in n for n in export.notes)  # layer 1 is compressed for real: lengths differ


def test_layer_level_strategies_export_as_before_and_without_torch(tmp_path):
    text = render_export(Strategy.uniform(2, "tova", 8), "kvpress", tmp_path / "p.py").files[tmp_path / "p.py"]
    assert "HEAD_GROUPS" not in text and "import torch" not in text and "duo_attention_press" not in text


def test_streaming_masks_keep_what_the_runtime_keeps_in_both_phases(tmp_path, monkeypatch):
    strategy = duo()
    path = tmp_path / "duo_press.py"
    path.write_text(render_export(strategy, "kvpress", path).files[path])
    press = load_press_module(path, monkeypatch, []).make_press()
    module = SimpleNamespace(layer_idx=0)
    model = tiny_model("llama", layers=2, seed=3)
    ids = torch.randint(1, 128, (1, 20), generator=torch.Generator().manual_seed(4))
    calls = [ids, ids[:, :3] + 1] + [ids[:, i : i + 1] for i in range(5)]  # prompt, a 3-token question, 5 steps
    length = 0
    with torch.no_grad(), apply_strategy(model, strategy):
        cache = None
        for chunk in calls:
            out = model(chunk, cache=cache, use_cache=True) if cache is not None else model(chunk, use_cache=True)
            cache = out.cache
            length += chunk.shape[1]
            hook_call(press, module, length, chunk.shape[1])
            parts = cache.layers[0].parts  # the runtime's groups: (1,) full, (0,) streaming
            for part, head in zip(parts, (1, 0)):
                assert visible_positions(module, head) == part.positions[0, 0].tolist(), (length, head)
    assert visible_positions(module, 0) == [0, 1, 24, 25, 26, 27] and len(visible_positions(module, 1)) == 28
    assert module.masked_key_indices[1].unique().tolist() == [0]  # only head 0 is masked


def test_scored_groups_keep_their_own_budget_per_head_in_prefill(tmp_path, monkeypatch):
    path = tmp_path / "hk_press.py"
    path.write_text(render_export(headkv(decoding_snapkv=False), "kvpress", path).files[path])
    calls: list = []
    press = load_press_module(path, monkeypatch, calls).make_press()
    module = SimpleNamespace(layer_idx=1)
    hook_call(press, module, 16, 16)
    assert ("score", 1, "SnapKVPress") in calls
    assert visible_positions(module, 0) == list(range(10))  # head 0 scores the oldest highest
    assert visible_positions(module, 1) == [2, 4, 9, 11]  # scores 7p mod 16: 14, 12, 15, 13
    hook_call(press, module, 19, 3)  # decoding: full heads, the new tokens are seen
    assert visible_positions(module, 0) == list(range(10)) + [16, 17, 18]


# ------------------------------------------------------------------------- refusals, --approximate
def test_scored_groups_in_decoding_are_refused_unless_approximate(tmp_path, capsys):
    with pytest.raises(ExportError, match=r"^kvpress cannot express layer 0 decoding KV heads \[0\] \(snapkv"):
        render_export(headkv(), "kvpress", tmp_path / "p.py")
    path = headkv().save(tmp_path / "s.json")
    out = tmp_path / "p.py"
    assert main(["export", str(path), "--format", "kvpress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--approximate" in err and not out.exists()
    assert main(["export", str(path), "--format", "kvpress", "--out", str(out), "--approximate"]) == 0
    printed = " ".join(capsys.readouterr().err.split())
    assert printed.count("warning: approximated layer") == 4 and "4 approximations" in printed
    text = out.read_text()
    assert "((0,), 'full', {}, None),  # snapkv(window=4) budget 10, approximated" in text
    assert "((0,), 'SnapKVPress', {'window_size': 4, 'kernel_size': 5}, 10)" in text
    assert "DUO_ATTENTION" not in text and json.loads(out.with_suffix(".json").read_text())["duo_attention"] is None


@pytest.mark.parametrize("pattern", ["h2o", "kvzip"])
def test_groups_kvpress_cannot_mask_are_refused_even_with_approximate(pattern, tmp_path, capsys):
    g = grouped(((0,), pattern, 8), ((1,), "full", 20))
    path = Strategy([g], [g], 14, 4, {}, context_len=20, num_kv_heads=2).save(tmp_path / "s.json")
    out = tmp_path / "p.py"
    for extra in ([], ["--approximate"]):
        assert main(["export", str(path), "--format", "kvpress", "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: kvpress cannot express layer 0 prefill KV heads [0] ({pattern}")
        assert len(err.splitlines()) == 1 and err.endswith("use --format json") and not out.exists()
