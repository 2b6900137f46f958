"""GGUF conversion and loading (a tiny GGUF written with ``gguf``), fingerprints, load errors, the default model."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from polykv_search import models as M
from polykv_search.models import (
    DEFAULT_MODEL,
    SMOLLM2_CHAT_TEMPLATE,
    ModelError,
    load_model,
    model_fingerprint,
    model_path,
)
from tests.models_support import (
    FAKE_PKG,
    TINY_GGUF,
    assert_one_line,
    cache,  # noqa: F401  (fixture)
    fake_builtin,
    fake_package,
)


def write_tiny_gguf(path: Path, *, layers: int = 2, hidden: int = 32, heads: int = 4, kv: int = 2, ffn: int = 64):
    """A random-init Llama GGUF (F32 tensors) with a byte-level BPE tokenizer and no chat template."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u[b] for b in range(256)] + ["he", "\u0120t"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    w.add_token_merges(["h e", "\u0120 t"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    rng = np.random.default_rng(0)

    def rand(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    rand("token_embd.weight", len(tokens), hidden)
    head_dim = hidden // heads
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        rand(f"blk.{i}.attn_q.weight", hidden, hidden)
        rand(f"blk.{i}.attn_k.weight", kv * head_dim, hidden)
        rand(f"blk.{i}.attn_v.weight", kv * head_dim, hidden)
        rand(f"blk.{i}.attn_output.weight", hidden, hidden)
        rand(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        rand(f"blk.{i}.ffn_up.weight", ffn, hidden)
        rand(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / TINY_GGUF)


# ---------------------------------------------------------------------------------------------
# GGUF conversion and loading (tiny GGUF)


@pytest.fixture
def tiny_builtin(tiny_gguf, tmp_path, monkeypatch, cache):  # noqa: F811
    """A built-in model ``tiny-test`` whose GGUF sits in an installed (never imported) fake package."""
    fake_package(tmp_path / "site", {TINY_GGUF: tiny_gguf.read_bytes()})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    builtin = fake_builtin()
    monkeypatch.setitem(M.BUILTIN_MODELS, builtin.name, builtin)
    return builtin


def test_builtin_gguf_is_converted_once_and_cached(tiny_builtin, cache, monkeypatch):  # noqa: F811
    model, tok = load_model("tiny-test")
    assert not model.training
    assert model.dtype == torch.float32
    assert model.config.num_hidden_layers == 2 and model.config.num_key_value_heads == 2
    assert getattr(model.config, "quantization_config", None) is None
    assert model.config.name_or_path == "tiny-test"
    assert model.polykv_source.kind == "builtin"
    # The GGUF had no chat template: the built-in's ChatML one is set; it round-trips through the cache.
    assert tok.chat_template == SMOLLM2_CHAT_TEMPLATE
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert tok.padding_side == "left"
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert tok.model_max_length == 256

    (ckpt,) = [p for p in (cache / "models").iterdir() if p.name.startswith("tiny-test-")]
    saved = json.loads((ckpt / "config.json").read_text())
    assert "quantization_config" not in saved
    assert (ckpt / "model.safetensors").is_file()
    assert FAKE_PKG not in sys.modules

    ids = tok(["hello there", "the"], return_tensors="pt", padding=True)
    assert ids.input_ids[1, 0].item() == tok.pad_token_id  # left padding
    with torch.no_grad():
        ref = model(**ids).logits

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached checkpoint should be used")

    monkeypatch.setattr(M, "_convert_gguf", no_conversion)
    monkeypatch.setattr(M, "builtin_gguf", no_conversion)
    model2, tok2 = load_model("tiny-test")
    with torch.no_grad():
        assert torch.equal(model2(**tok2(["hello there", "the"], return_tensors="pt", padding=True)).logits, ref)
    assert model_fingerprint(model2) == model_fingerprint(model)

    out = model2.generate(**ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, ids.input_ids.shape[1] + 3)


def test_local_gguf_file(tiny_gguf, cache):  # noqa: F811
    model, tok = load_model(str(tiny_gguf), dtype="bfloat16", attn_implementation="eager")
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    assert model.polykv_source.kind == "gguf"
    assert tok.chat_template is None  # only built-ins get a template added
    assert getattr(model.config, "quantization_config", None) is None
    assert len(list((cache / "models" / "gguf").glob("Tiny-Test.F32-*"))) == 1


def test_local_checkpoint_dtype_and_fingerprint(tiny_builtin):
    ckpt = M.model_path("tiny-test")
    m32, _ = load_model(ckpt)
    m16, _ = load_model(ckpt, dtype="bf16")
    assert m32.polykv_source.kind == "local" and m16.dtype == torch.bfloat16
    fp = model_fingerprint(m32)
    assert len(fp) == 12 and int(fp, 16) >= 0
    assert model_fingerprint(m16) == fp  # dtype is how it runs, not what it is
    m32.config.num_hidden_layers += 1
    assert model_fingerprint(m32) != fp
    m32.config.num_hidden_layers -= 1
    m32.polykv_source = M.ModelSource(name="other", kind="local", location="/x/other")
    assert model_fingerprint(m32) != fp


def test_fingerprint_without_polykv_source():
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from tiny import tiny_model
    finally:
        sys.path.pop(0)
    a, b = tiny_model("llama"), tiny_model("qwen3")
    c = tiny_model("llama", seed=1)
    assert model_fingerprint(a) == model_fingerprint(c)  # weights are not hashed
    assert model_fingerprint(a) != model_fingerprint(b)
    a.config.name_or_path = "/home/someone/models/llama-x"
    c.config.name_or_path = "/other/machine/llama-x"
    assert model_fingerprint(a) == model_fingerprint(c)  # independent of where it was loaded from
    c.config.name_or_path = "org/llama-y"
    assert model_fingerprint(a) != model_fingerprint(c)


def test_load_errors_are_one_line(monkeypatch, cache):  # noqa: F811
    import transformers

    def unreachable(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'.\nCheck your connection.")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", unreachable)
    monkeypatch.setattr("polykv_search.models._check_hub", lambda repo_id: None)  # as if the hub answered
    with pytest.raises(ModelError, match="not a built-in name .*smollm2-135m.*couldn't connect") as exc_info:
        load_model("some-org/some-model")
    assert_one_line(exc_info)


def test_unreachable_hub_id_fails_at_once_in_one_line(monkeypatch):
    """One metadata request without retries (transformers alone retries for about a minute)."""
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    calls = []

    def no_network(self, repo_id, **kwargs):
        calls.append((repo_id, kwargs.get("timeout")))
        raise ConnectionError("[Errno -2] Name or service not known")

    def from_pretrained(*args, **kwargs):
        raise AssertionError("from_pretrained must not run for an unreachable hub id")

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo_id, filename: None)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_network)
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    with pytest.raises(ModelError, match="not in the local Hugging Face cache and the hub is unreachable") as exc_info:
        load_model("some-org/some-model")
    assert_one_line(exc_info)
    assert calls == [("some-org/some-model", 10.0)]

    def not_found(self, repo_id, **kwargs):
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its __init__ wants a real HTTP response
        Exception.__init__(err, "404 Client Error: Repository Not Found")
        raise err

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", not_found)
    with pytest.raises(ModelError, match="no such model on the Hugging Face hub") as exc_info:
        model_path("some-org/some-model")
    assert_one_line(exc_info)


# ---------------------------------------------------------------------------------------------
# The real default model


@pytest.mark.slow
@pytest.mark.smoke
def test_default_model_smollm2():
    """Loads SmolLM2-135M-Instruct (first time: from the wheel's GGUF, ~30-60 s on CPU; then cached)."""
    start = time.perf_counter()
    model, tok = load_model()
    first = time.perf_counter() - start
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert model.config.name_or_path == DEFAULT_MODEL
    assert "<|im_start|>" in (tok.chat_template or "")
    assert tok.padding_side == "left" and tok.pad_token is not None

    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    text = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    assert text
    print(f"\nSmolLM2 answer: {text!r}")

    start = time.perf_counter()
    model2, _ = load_model()
    second = time.perf_counter() - start
    print(f"load_model(): first {first:.1f} s, second {second:.2f} s; fingerprint {model_fingerprint(model2)}")
    assert model_fingerprint(model2) == model_fingerprint(model)
