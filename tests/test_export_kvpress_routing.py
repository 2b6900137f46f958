"""`--format kvpress`: the module run against a stand-in kvpress (the real one: scripts/verify_kvpress_export.py)."""

from __future__ import annotations

import importlib.util
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from test_export_kvpress import mixed

from strategies import LayerChoice, Strategy
from strategies.exporters import ExportError, render_export


# --------------------------------------------------------------------- the module against a stand-in
def fake_kvpress(calls: list) -> types.ModuleType:
    """Just enough of kvpress 0.5's API for the generated module: records what each press is asked."""
    kv = types.ModuleType("kvpress")

    @dataclass
    class BasePress:
        def post_init_from_model(self, model):
            calls.append(("post_init", type(self).__name__))

        @contextmanager
        def __call__(self, model):
            self.post_init_from_model(model)
            yield

    @dataclass
    class PrefillDecodingPress(BasePress):
        prefilling_press: object = None
        decoding_press: object = None

    @dataclass
    class ScorerPress(BasePress):
        compression_ratio: float = 0.0

        def forward_hook(self, module, input, kwargs, output):
            n = kwargs["hidden_states"].shape[1]
            kept = max(1, int(n * (1 - self.compression_ratio)))
            calls.append(("prefill", module.layer_idx, type(self).__name__, dict(vars(self)), kept))
            return output

    @dataclass
    class SnapKVPress(ScorerPress):
        window_size: int = 64
        kernel_size: int = 5

    @dataclass
    class StreamingLLMPress(ScorerPress):
        n_sink: int = 4

    @dataclass
    class DecodingPress(BasePress):
        base_press: object = None
        compression_interval: int = 512
        target_size: int = 2048
        hidden_states_buffer_size: int = 256

        def forward_hook(self, module, input, kwargs, output):
            calls.append(
                (
                    "decoding",
                    module.layer_idx,
                    type(self.base_press).__name__,
                    self.target_size,
                    self.compression_interval,
                )
            )
            return output

        def reset(self):
            calls.append(("reset",))

    kv.BasePress, kv.PrefillDecodingPress, kv.ScorerPress, kv.DecodingPress = (
        BasePress,
        PrefillDecodingPress,
        ScorerPress,
        DecodingPress,
    )
    kv.SnapKVPress, kv.StreamingLLMPress = SnapKVPress, StreamingLLMPress
    for name in ("TOVAPress", "ObservedAttentionPress", "KnormPress"):
        setattr(kv, name, dataclass(type(name, (ScorerPress,), {})))
    return kv


def load_module(path, monkeypatch, calls):
    monkeypatch.setitem(sys.modules, "kvpress", fake_kvpress(calls))
    spec = importlib.util.spec_from_file_location("polykv_exported_press", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "polykv_exported_press", mod)
    spec.loader.exec_module(mod)
    return mod


def test_generated_press_routes_each_layer_to_its_press_and_budget(tmp_path, monkeypatch):
    out = tmp_path / "mixed_press.py"
    out.write_text(render_export(mixed(), "kvpress", out).files[out])
    calls: list = []
    mod = load_module(out, monkeypatch, calls)
    press = mod.make_press()
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=3))
    n = 100
    with press(model):
        for i in range(3):  # prefill: the prompt enters an empty cache
            press.forward_hook(
                SimpleNamespace(layer_idx=i),
                (),
                {"hidden_states": torch.zeros(1, n, 4), "cache_position": torch.arange(n)},
                None,
            )
        for i in range(3):  # one decoding step
            press.forward_hook(
                SimpleNamespace(layer_idx=i),
                (),
                {"hidden_states": torch.zeros(1, 1, 4), "cache_position": torch.tensor([n])},
                None,
            )
    prefill = [c for c in calls if c[0] == "prefill"]
    assert [(c[1], c[2], c[4]) for c in prefill] == [(1, "SnapKVPress", 40), (2, "ObservedAttentionPress", 24)]
    assert prefill[0][3]["window_size"] == 8 and prefill[0][3]["kernel_size"] == 5
    assert press.prefill_presses[1][0].compression_ratio == 0.0  # restored after the call
    assert [c for c in calls if c[0] == "decoding"] == [
        ("decoding", 0, "StreamingLLMPress", 32, 1),
        ("decoding", 1, "TOVAPress", 32, 1),
    ]
    assert calls[-2:] == [("reset",), ("reset",)]  # both decoding presses are reset on exit
    with pytest.raises(ValueError, match="exported for 3 layers; the model has 30"):
        with press(SimpleNamespace(config=SimpleNamespace(num_hidden_layers=30))):
            pass


def test_ratio_keeps_exactly_the_budget(tmp_path, monkeypatch):
    out = tmp_path / "p.py"
    out.write_text(render_export(mixed(), "kvpress", out).files[out])
    mod = load_module(out, monkeypatch, [])
    for n in list(range(2, 400)) + [1000, 4096, 8191, 32768, 131072]:
        for b in {1, 2, 3, 7, 16, 31, 64, 100, 127, 128, 255, 512, 1000, 4095, n - 1, n // 3, n // 2}:
            if 1 <= b < n:
                r = mod.ratio_for(b, n)
                assert 0 < r < 1 and int(n * (1 - r)) == b, (b, n, r)
    assert mod.ratio_for(64, 64) == 0.0 and mod.ratio_for(64, 10) == 0.0


def test_module_and_sidecar_of_different_exports_are_refused(tmp_path, monkeypatch):
    from polykv_search.io import atomic_write_text
    from strategies.exporters import export_strategy
    from strategies.kvpress_sidecar import read_export

    out = tmp_path / "mixed_press.py"
    export_strategy(mixed(), "kvpress", out)
    assert read_export(out)["strategy_digest"] == mixed().digest()
    mod = load_module(out, monkeypatch, [])
    assert mod.STRATEGY_DIGEST == mixed().digest() and mod.sidecar()["strategy_digest"] == mixed().digest()
    other = Strategy.uniform(3, "tova", 32)
    sidecar = render_export(other, "kvpress", out).files[tmp_path / "mixed_press.json"]
    atomic_write_text(tmp_path / "mixed_press.json", sidecar)  # as a kill between the two renames leaves it
    with pytest.raises(ValueError, match=f"mixed_press.json was exported from strategy {other.digest()}"):
        mod.sidecar()
    with pytest.raises(ExportError, match=f"the module is of strategy {mixed().digest()}, its sidecar"):
        read_export(out)
    (tmp_path / "mixed_press.json").unlink()
    with pytest.raises(ExportError, match="cannot read it with its sidecar mixed_press.json"):
        read_export(out)


def test_kvzip_layers_build_kvzip_press_with_the_patterns_sinks(tmp_path, monkeypatch):
    """kvpress 0.5.5's ``KVzipPress`` has ``n_sink`` (default 4): the exported press keeps the pattern's own count."""
    strategy = Strategy(
        [LayerChoice("kvzip", 32, {"n_sink": 2}), LayerChoice("kvzip", 16, {"n_sink": 8, "plus": True})],
        [LayerChoice("full", 24), LayerChoice("full", 24)],
        global_budget=24,
        b_min=16,
    )
    out = tmp_path / "kvzip_press.py"
    out.write_text(render_export(strategy, "kvpress", out).files[out])
    text = out.read_text()
    assert "('KVzipPress', {'layerwise': True, 'n_sink': 2}, 32)" in text
    assert "('KVzipPress', {'layerwise': True, 'n_sink': 8, 'kvzip_plus_normalization': True}, 16)" in text

    calls: list = []
    kv = fake_kvpress(calls)

    @dataclass
    class KVzipPress(kv.BasePress):  # kvpress 0.5.5's fields: an argument it lacks is a TypeError
        compression_ratio: float = 0.0
        layerwise: bool = False
        n_sink: int = 4
        kvzip_plus_normalization: bool = False
        chunk_size: int = 2048

    kv.KVzipPress = KVzipPress
    monkeypatch.setitem(sys.modules, "kvpress", kv)
    spec = importlib.util.spec_from_file_location("polykv_kvzip_press", out)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "polykv_kvzip_press", mod)
    spec.loader.exec_module(mod)
    presses = [entry[0] for entry in mod.make_press().prefill_presses]
    assert [(p.layerwise, p.n_sink, p.kvzip_plus_normalization) for p in presses] == [(True, 2, False), (True, 8, True)]
