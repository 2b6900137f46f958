"""`--format trtllm` and `--format vllm`: exact files for fixed strategies, refusals that name the
layer and pattern, and what `--approximate` changes (and says it changes)."""

from __future__ import annotations

import json

import pytest

from strategies import LayerChoice, Strategy
from strategies.exporters import ExportError, ExportOptions, render_export

NO_SINK = {"n_sink": 0}


def S(prefill, decoding, B=64, b_min=16) -> Strategy:
    return Strategy(
        [LayerChoice(*c) for c in prefill], [LayerChoice(*c) for c in decoding], B, b_min, {"solver": "test"}
    )


def same(*layers) -> Strategy:
    return S(layers, layers)


def render(strategy, fmt, tmp_path, **options):
    out = tmp_path / ("out.yaml" if fmt == "trtllm" else "out.json")
    export = render_export(strategy, fmt, out, ExportOptions(**options))
    assert list(export.files) == [out]
    return export.files[out], export


# ------------------------------------------------------------------------------------- trtllm
TRTLLM_EXACT = """# TensorRT-LLM KV-cache settings exported by polykv-search: strategy 472199577541122b, 4 layers, B = 64, b_min = 16, solver test.
# Use: trtllm-serve MODEL --extra_llm_api_options THIS_FILE, or
#      LLM(MODEL, kv_cache_config=KvCacheConfig(**yaml.safe_load(open(THIS_FILE))["kv_cache_config"])).
# Note: TensorRT-LLM applies each layer's window in both phases: prompt tokens of a windowed layer
#   attend only within the window (polykv-search lets the whole prompt attend, then compresses), and
#   while decoding the window is the layer's capacity.
# Note: sink tokens need a TensorRT-LLM build with StreamingLLM support (e.g. engines built with
#   --streamingllm enable); its StreamingLLM mode places RoPE by position in the cache,
#   polykv-search keeps absolute positions.
# max_attention_window[l]: the tokens layer l keeps (its budget, sinks included); full layers get
#   max_seq_len.
kv_cache_config:
  max_attention_window:
    - 4096  # layer 0: full
    - 64  # layer 1: streaming_llm budget 64
    - 32  # layer 2: streaming_llm budget 32
    - 4096  # layer 3: full
  sink_token_length: 4
"""  # noqa: E501 - generated settings, byte for byte

TRTLLM_APPROX = """# TensorRT-LLM KV-cache settings exported by polykv-search: strategy be765d5e2656be4c, 4 layers, B = 64, b_min = 16, solver test.
# Use: trtllm-serve MODEL --extra_llm_api_options THIS_FILE, or
#      LLM(MODEL, kv_cache_config=KvCacheConfig(**yaml.safe_load(open(THIS_FILE))["kv_cache_config"])).
# Note: TensorRT-LLM applies each layer's window in both phases: prompt tokens of a windowed layer
#   attend only within the window (polykv-search lets the whole prompt attend, then compresses), and
#   while decoding the window is the layer's capacity.
# Note: sink tokens need a TensorRT-LLM build with StreamingLLM support (e.g. engines built with
#   --streamingllm enable); its StreamingLLM mode places RoPE by position in the cache,
#   polykv-search keeps absolute positions.
# Approximated (--approximate): layer 1: n_sink=2 -> 4 (TensorRT-LLM has one sink_token_length).
# Approximated (--approximate): layer 2: snapkv budget 48 -> sliding window of 48 with the model's 4
#   sink tokens.
# Approximated (--approximate): layer 3: decoding tova budget 48 -> same as prefill (streaming_llm
#   budget 48), TensorRT-LLM has one setting per layer for both phases.
# max_attention_window[l]: the tokens layer l keeps (its budget, sinks included); full layers get
#   max_seq_len.
kv_cache_config:
  max_attention_window:
    - 4096  # layer 0: full
    - 64  # layer 1: streaming_llm(n_sink=2) budget 64
    - 48  # layer 2: snapkv budget 48
    - 48  # layer 3: streaming_llm budget 48
  sink_token_length: 4
"""  # noqa: E501 - generated settings, byte for byte


def trt_exact():
    return same(("full", 96), ("streaming_llm", 64), ("streaming_llm", 32), ("full", 64))


def trt_mixed():
    return S(
        [("full", 96), ("streaming_llm", 64, {"n_sink": 2}), ("snapkv", 48), ("streaming_llm", 48)],
        [("full", 96), ("streaming_llm", 64, {"n_sink": 2}), ("snapkv", 48), ("tova", 48)],
    )


def test_trtllm_exact_file(tmp_path):
    text, export = render(trt_exact(), "trtllm", tmp_path, max_seq_len=4096)
    assert text == TRTLLM_EXACT
    assert export.warnings == []
    assert export.notes[0].startswith("TensorRT-LLM applies each layer's window in both phases")


def test_trtllm_file_is_the_kv_cache_config_yaml(tmp_path):
    yaml = pytest.importorskip("yaml")
    text, _ = render(trt_exact(), "trtllm", tmp_path, max_seq_len=4096)
    assert yaml.safe_load(text) == {
        "kv_cache_config": {"max_attention_window": [4096, 64, 32, 4096], "sink_token_length": 4}
    }
    text, _ = render(Strategy.full(3), "trtllm", tmp_path)
    assert yaml.safe_load(text) == {"kv_cache_config": {}}


def test_trtllm_refuses_naming_the_first_layer_and_pattern(tmp_path):
    with pytest.raises(ExportError) as err:
        render(trt_mixed(), "trtllm", tmp_path, max_seq_len=4096)
    assert str(err.value) == (
        "trtllm cannot express layer 1 (prefill streaming_llm(n_sink=2) budget 64): TensorRT-LLM has one "
        "sink_token_length for all layers and layer 3 has n_sink=4; 2 more layers cannot be expressed either. "
        "Pass --approximate to change such layers (it prints every change), or use --format kvpress"
    )
    with pytest.raises(
        ExportError,
        match=r"^trtllm cannot express layer 0 \(prefill h2o budget 64\): TensorRT-LLM keeps "
        r"only full layers and sliding windows with sinks \(full, streaming_llm\); 1 more layer",
    ):
        render(same(("h2o", 64), ("knorm", 64)), "trtllm", tmp_path)
    with pytest.raises(
        ExportError,
        match=r"layer 0 \(prefill streaming_llm budget 64, decoding streaming_llm budget 48\): "
        r"TensorRT-LLM applies one setting per layer to both phases\. Pass --approximate",
    ):
        render(S([("streaming_llm", 64)], [("streaming_llm", 48)]), "trtllm", tmp_path)


def test_trtllm_approximate_changes_and_lists_every_change(tmp_path):
    text, export = render(trt_mixed(), "trtllm", tmp_path, max_seq_len=4096, approximate=True)
    assert text == TRTLLM_APPROX
    assert export.warnings == [
        "layer 1: n_sink=2 -> 4 (TensorRT-LLM has one sink_token_length)",
        "layer 2: snapkv budget 48 -> sliding window of 48 with the model's 4 sink tokens",
        "layer 3: decoding tova budget 48 -> same as prefill (streaming_llm budget 48), TensorRT-LLM has one "
        "setting per layer for both phases",
    ]


def test_trtllm_needs_max_seq_len_only_for_full_layers_beside_windows(tmp_path):
    with pytest.raises(ExportError, match=r"^trtllm needs --max-seq-len: layer 0 is full"):
        render(trt_exact(), "trtllm", tmp_path)
    text, export = render(same(("streaming_llm", 64), ("streaming_llm", 64)), "trtllm", tmp_path)
    assert text.endswith(
        "  max_attention_window:\n    - 64  # layer 0: streaming_llm budget 64\n"
        "    - 64  # layer 1: streaming_llm budget 64\n  sink_token_length: 4\n"
    )
    text, export = render(Strategy.full(3), "trtllm", tmp_path)
    assert text.endswith("# Every layer keeps every token (FullKV): nothing to limit.\nkv_cache_config: {}\n")
    assert export.notes == []


def test_trtllm_clamps_windows_to_max_seq_len(tmp_path):
    text, export = render(trt_exact(), "trtllm", tmp_path, max_seq_len=50)
    assert "    - 50  # layer 0: full\n    - 50  # layer 1: streaming_llm budget 64\n    - 32  # layer 2" in text
    assert export.notes[-1] == "layer 1: budget >= --max-seq-len 50, so the window is 50 (full)"


def test_trtllm_approximated_patterns_get_no_sinks_when_no_layer_has_any(tmp_path):
    text, export = render(same(("h2o", 64), ("streaming_llm", 64, NO_SINK)), "trtllm", tmp_path, approximate=True)
    assert export.warnings == ["layer 0: h2o budget 64 -> sliding window of 64"]
    assert text.endswith(
        "    - 64  # layer 0: h2o budget 64\n    - 64  # layer 1: streaming_llm(n_sink=0) budget 64\n"
        "  sink_token_length: 0\n"
    )


# --------------------------------------------------------------------------------------- vllm
VLLM_EXACT = """{
  "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
  "sliding_window": 48,
  "use_sliding_window": true
}
"""

VLLM_APPROX = """{
  "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"],
  "sliding_window": 53,
  "use_sliding_window": true
}
"""

VLLM_FULL = """{
  "layer_types": ["full_attention", "full_attention", "full_attention"],
  "sliding_window": null,
  "use_sliding_window": false
}
"""


def vllm_mixed():
    return same(("full", 96), ("streaming_llm", 64, NO_SINK), ("streaming_llm", 32, NO_SINK), ("h2o", 64))


def test_vllm_exact_files(tmp_path):
    text, export = render(
        same(("full", 96), ("streaming_llm", 48, NO_SINK), ("streaming_llm", 48, NO_SINK), ("full", 64)),
        "vllm",
        tmp_path,
    )
    assert text == VLLM_EXACT
    assert json.loads(text)["sliding_window"] == 48
    assert export.warnings == []
    text, export = render(Strategy.full(3), "vllm", tmp_path)
    assert text == VLLM_FULL


def test_vllm_refuses_naming_the_first_layer_and_pattern(tmp_path):
    with pytest.raises(ExportError) as err:
        render(vllm_mixed(), "vllm", tmp_path)
    assert str(err.value) == (
        "vllm cannot express layer 2 (prefill streaming_llm(n_sink=0) budget 32): vLLM has one sliding_window "
        "for all layers and layer 1 has 64; 1 more layer cannot be expressed either. Pass --approximate to "
        "change such layers (it prints every change), or use --format kvpress"
    )
    with pytest.raises(
        ExportError,
        match=r"^vllm cannot express layer 0 \(prefill streaming_llm budget 64\): "
        r"vLLM's sliding window keeps no sink tokens; 1 more layer",
    ):
        render(Strategy.uniform(2, "streaming_llm", 64), "vllm", tmp_path)
    with pytest.raises(
        ExportError,
        match=r"^vllm cannot express layer 1 \(prefill tova budget 64\): vLLM keeps only full "
        r"layers and sliding windows without sinks",
    ):
        render(same(("full", 64), ("tova", 64)), "vllm", tmp_path)


def test_vllm_approximate_uses_the_mean_window_and_lists_every_change(tmp_path):
    text, export = render(vllm_mixed(), "vllm", tmp_path, approximate=True)
    assert text == VLLM_APPROX
    assert export.warnings == [
        "layer 1: window 64 -> 53 (vLLM has one sliding_window: the mean)",
        "layer 2: window 32 -> 53 (vLLM has one sliding_window: the mean)",
        "layer 3: h2o budget 64 -> sliding window of 64",
        "layer 3: window 64 -> 53 (vLLM has one sliding_window: the mean)",
    ]
    _, export = render(Strategy.uniform(2, "streaming_llm", 64), "vllm", tmp_path, approximate=True)
    assert export.warnings == [
        "layer 0: n_sink=4 -> 0 (vLLM's sliding window keeps no sinks)",
        "layer 1: n_sink=4 -> 0 (vLLM's sliding window keeps no sinks)",
    ]


def test_options_a_format_does_not_use_are_refused(tmp_path):
    with pytest.raises(ExportError, match=r"^--max-seq-len does not apply to --format vllm$"):
        render(Strategy.full(2), "vllm", tmp_path, max_seq_len=128)
    with pytest.raises(ExportError, match=r"--out for --format vllm must end in \.json"):
        render_export(Strategy.full(2), "vllm", tmp_path / "x.yaml")
    with pytest.raises(ExportError, match=r"unknown export format 'onnx'; known: json, kvpress, trtllm, vllm"):
        render_export(Strategy.full(2), "onnx", tmp_path / "x")
    # --approximate is a permission: harmless where nothing needs approximating
    text, export = render(Strategy.full(3), "vllm", tmp_path, approximate=True)
    assert text == VLLM_FULL and export.warnings == []
