"""What needs the tokenizer but not the model is checked before the model loads: a ``score --context-len`` too
short for a task's prompt, ``collect --samples`` more than the corpus holds, a ``generate`` prompt or
``--max-new-tokens`` past the model's positions. Each is one ``error:`` line, exit code 2, nothing written, and
the weights are never read (loading them raises :class:`~tests.bad_inputs_support.ModelLoaded`)."""

from __future__ import annotations

import pytest

from polykv_search.cli import main
from tests.bad_inputs_support import ModelLoaded, snapshot
from tests.models_support import saved_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return saved_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture
def no_weights(monkeypatch):
    import transformers

    def loading(*args, **kwargs):
        raise ModelLoaded("the model's weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loading)


def refused(argv: list[str], match: str, tmp_path, capsys) -> None:
    before = snapshot(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in out + err, err
    assert match in err, err
    assert snapshot(tmp_path) == before


def test_score_refuses_a_context_too_short_for_a_task_before_the_model_loads(checkpoint, no_weights, tmp_path, capsys):
    ckpt, corpus = checkpoint
    argv = ["score", "--model", str(ckpt), "--corpus", str(corpus), "--baseline", "full", "--samples", "1"]
    argv += ["--context-len", "3", "--out", str(tmp_path / "r.json")]
    refused(argv, "is too short for this task", tmp_path, capsys)


def test_collect_refuses_more_samples_than_the_corpus_holds_before_the_model_loads(
    checkpoint, no_weights, tmp_path, capsys
):
    ckpt, corpus = checkpoint
    argv = ["collect", "--model", str(ckpt), "--calib", str(corpus), "--budgets", "8,16", "--context-len", "64"]
    argv += ["--continuation-len", "8", "--samples", "9000", "--out", str(tmp_path / "sig.json")]
    refused(argv, "9000 requested", tmp_path, capsys)


def test_collect_refuses_more_head_samples_than_the_corpus_holds_before_the_model_loads(
    checkpoint, no_weights, tmp_path, capsys
):
    """--retrieval-heads' evidence samples are drawn with the calibration samples, not after the collection."""
    ckpt, corpus = checkpoint
    argv = ["collect", "--model", str(ckpt), "--calib", str(corpus), "--budgets", "8,16", "--context-len", "64"]
    argv += ["--continuation-len", "8", "--samples", "2", "--retrieval-heads", "9000", "--out", str(tmp_path / "s")]
    refused(argv, "9000 requested", tmp_path, capsys)


def test_generate_refuses_a_run_past_the_models_positions_before_the_model_loads(
    checkpoint, no_weights, tmp_path, capsys
):
    ckpt, _ = checkpoint  # its config holds 512 positions
    argv = ["generate", "--model", str(ckpt), "--no-chat", "--prompt", "abc"]
    refused([*argv, "--max-new-tokens", "600"], "over the 512 of", tmp_path, capsys)
    (tmp_path / "long.txt").write_text("a" * 600)
    refused([*argv[:-2], "--prompt-file", str(tmp_path / "long.txt")], "a prompt of 60", tmp_path, capsys)


def test_good_values_pass_those_checks_and_reach_the_model(checkpoint, no_weights, tmp_path):
    ckpt, corpus = checkpoint
    for argv in (
        ["score", "--model", str(ckpt), "--corpus", str(corpus), "--baseline", "full", "--samples", "1"]
        + ["--suite", "broad/continuation", "--context-len", "100", "--out", str(tmp_path / "r.json")],
        ["collect", "--model", str(ckpt), "--calib", str(corpus), "--budgets", "8,16", "--context-len", "64"]
        + ["--continuation-len", "8", "--samples", "2", "--out", str(tmp_path / "sig.json")],
        ["generate", "--model", str(ckpt), "--no-chat", "--prompt", "abc", "--max-new-tokens", "400"],
    ):
        with pytest.raises(ModelLoaded):
            main(argv)
