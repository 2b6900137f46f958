"""Model options (dtype, device, attention) refused before loading, and model names resolved to their kind."""

from __future__ import annotations

import pytest
import torch

from polykv_search import models as M
from polykv_search.models import DEFAULT_MODEL, ModelError, load_model, parse_device, parse_dtype, resolve_model
from tests.models_support import assert_one_line

# ---------------------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(
    "value, expected",
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("BFloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
        ("float16", torch.float16),
        ("torch.float16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_parse_dtype(value, expected):
    assert parse_dtype(value) is expected


@pytest.mark.parametrize("value", ["float64", "int8", "", "fp8", torch.float64, torch.int8, None, 32])
def test_parse_dtype_errors(value):
    with pytest.raises(ModelError, match="invalid dtype") as exc_info:
        parse_dtype(value)
    assert_one_line(exc_info)


def test_parse_device_cpu_and_auto(monkeypatch):
    assert parse_device("cpu") == torch.device("cpu")
    assert parse_device(" CPU ") == torch.device("cpu")
    assert parse_device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cuda:-1", "", "meta", "cpu:zero", 3.5])
def test_parse_device_errors(value):
    with pytest.raises(ModelError, match="device") as exc_info:
        parse_device(value)
    assert_one_line(exc_info)


def test_parse_device_cuda_unavailable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for value in ("cuda", "cuda:0"):
        with pytest.raises(ModelError, match="CUDA is not available") as exc_info:
            parse_device(value)
        assert_one_line(exc_info)


def test_parse_device_cuda_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert parse_device("cuda") == torch.device("cuda")
    assert parse_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ModelError, match="only 1 CUDA device"):
        parse_device("cuda:1")


def test_load_model_rejects_bad_options_before_loading(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("nothing should be resolved or loaded")

    monkeypatch.setattr(M, "model_path", boom)
    for kwargs, match in [
        ({"dtype": "float64"}, "invalid dtype"),
        ({"device": "tpu"}, "device"),
        ({"attn_implementation": "fast"}, "invalid attn_implementation"),
    ]:
        with pytest.raises(ModelError, match=match) as exc_info:
            load_model(DEFAULT_MODEL, **kwargs)
        assert_one_line(exc_info)


# ---------------------------------------------------------------------------------------------
# Resolving names


def test_resolve_builtin_names():
    for name in ("smollm2-135m", "SmolLM2-135M", "smollm2", "SmolLM2-135M-Instruct", " default "):
        source = resolve_model(name)
        assert (source.kind, source.name, source.location) == ("builtin", DEFAULT_MODEL, DEFAULT_MODEL)
    assert resolve_model().kind == "builtin"


def test_resolve_local_paths(tmp_path, monkeypatch):
    ckpt = tmp_path / "my-model"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    source = resolve_model(str(ckpt))
    assert (source.kind, source.name, source.location) == ("local", "my-model", str(ckpt.resolve()))
    assert resolve_model(ckpt) == source  # os.PathLike
    monkeypatch.chdir(tmp_path)
    assert resolve_model("./my-model") == source

    gguf_file = tmp_path / "weights.Q8_0.gguf"
    gguf_file.write_bytes(b"GGUF")
    source = resolve_model(str(gguf_file))
    assert (source.kind, source.name) == ("gguf", "weights.Q8_0")

    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    for bad, match in [
        (str(tmp_path / "empty"), "no config.json"),
        (str(tmp_path / "notes.txt"), "not a .gguf"),
        (str(tmp_path / "missing"), "does not exist"),
        ("./missing-model", "does not exist"),
        ("missing.gguf", "does not exist"),
        ("a/b/c", "does not exist"),
        ("", "invalid model name"),
        (None, "invalid model name"),
    ]:
        with pytest.raises(ModelError, match=match) as exc_info:
            resolve_model(bad)
        assert_one_line(exc_info)


def test_resolve_hub_ids():
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "Qwen/Qwen3-0.6B"):
        source = resolve_model(name)
        assert (source.kind, source.name, source.location) == ("hub", name, name)
