"""``benchmarks/shape_model.py``: a random-weight checkpoint with a named layer shape, which the runtime
evicts from like any Llama checkpoint (for cost benchmarks only)."""

from __future__ import annotations

import pytest
import torch

from polykv_search.runtime import apply_strategy
from polykv_search.runtime.reconstruction import ReconstructionInputs
from strategies import Strategy
from tests.conftest import benchmark_script
from tests.test_eval_support import char_tokenizer

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def shape_model():
    return benchmark_script("shape_model")


def test_the_named_shapes_are_the_published_layer_widths(shape_model):
    llama = shape_model.SHAPES["llama-3.1-8b"]
    assert (llama["hidden_size"], llama["intermediate_size"]) == (4096, 14336)
    assert (llama["num_attention_heads"], llama["num_key_value_heads"]) == (32, 8)


def test_a_built_model_has_the_shape_the_layers_and_the_tokenizers_vocabulary(shape_model):
    tok = char_tokenizer()
    model = shape_model.build(TINY, 3, tok)
    config = model.config
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 96, 3)
    assert config.num_key_value_heads == 2 and config.head_dim == 16
    assert config.vocab_size == len(tok)
    assert not model.training


def test_the_runtime_evicts_from_it_with_a_reconstruction_pattern(shape_model):
    tok = char_tokenizer()
    model = shape_model.build(TINY, 2, tok)
    ids = tok("the cost of a pass depends on the shape, " * 3, return_tensors="pt").input_ids
    pass_inputs = ReconstructionInputs.from_tokenizer(tok)
    with apply_strategy(model, Strategy.uniform(2, "kvzip", 16), reconstruction=pass_inputs) as rt, torch.no_grad():
        out = model(ids, use_cache=True)
        held = rt.report(out.past_key_values).kv_bytes
    full = 2 * 2 * 2 * ids.shape[1] * 16 * 4  # layers x (K, V) x KV heads x tokens x head dim x fp32
    assert 0 < held < full


def test_an_existing_folder_is_refused(shape_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        shape_model.main(["--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "exists" in capsys.readouterr().err
