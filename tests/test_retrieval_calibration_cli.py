"""`collect --retrieval-mix` through the CLI, and the evidence fitting the default model's default continuation."""

from __future__ import annotations

import pytest
from test_retrieval_calibration import (
    M,
    N,
    char_tokenizer,
    one_thread,  # noqa: F401  (autouse: one intra-op thread)
)
from tiny import tiny_model

from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix
from signals import SignalTable
from signals.journal import journal_path


# ------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-evidence")
    tiny_model("llama", layers=2).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    corpus = path / "corpus.txt"
    corpus.write_text(
        " ".join(f"It was the {i}th day of the fair, and the lanes were full. Who could say why?" for i in range(120))
    )
    return path, corpus


def cli_argv(ckpt, corpus, out, *extra):
    return [
        "collect",
        "--model",
        str(ckpt),
        "--calib",
        str(corpus),
        "--samples",
        "2",
        "--context-len",
        str(N),
        "--continuation-len",
        str(M),
        "--patterns",
        "snapkv",
        "--budgets",
        "16",
        "--layers",
        "0",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def test_cli_collect_with_a_mix(checkpoint, tmp_path, capsys):
    from polykv_search.cli import main

    ckpt, corpus = checkpoint
    out = tmp_path / "mixed.json"
    assert main(cli_argv(ckpt, corpus, out, "--retrieval-mix", "1", "--evidence-records", "3")) == 0
    assert "1 with evidence" in " ".join(capsys.readouterr().err.split())
    table = SignalTable.load(out)
    r = table.retrieval
    assert (
        r["mix"] == "1"
        and r["evidence_samples"] == 1
        and r["records_per_sample"] == 3
        and r["samples"][0]["index"] == 1
    )
    assert table.provenance["collect_key"]["scored"][1] == r["samples"][0]["scored"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--retrieval-mix", "-1"], "--retrieval-mix '-1': must not be negative"),
        (["--retrieval-mix", "1.5"], "--retrieval-mix '1.5': a fraction must lie in [0, 1]"),
        (["--retrieval-mix", "lots"], "--retrieval-mix 'lots'"),
        (["--retrieval-mix", "nan"], "--retrieval-mix 'nan'"),
        (["--retrieval-mix", "3"], "only 2 samples"),
        (["--retrieval-mix", "0.1"], "rounds to 0"),
        (["--evidence-records", "2"], "give --retrieval-mix"),
        (["--retrieval-mix", "1", "--continuation-len", "8"], "continuation_len 8 is too short"),
    ],
)
def test_cli_bad_mix_is_a_one_line_error_exit_2(checkpoint, tmp_path, capsys, extra, message):
    from polykv_search.cli import main

    ckpt, corpus = checkpoint
    out = tmp_path / "signals.json"
    assert main(cli_argv(ckpt, corpus, out, *extra)) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and not journal_path(out).exists()


@pytest.mark.slow
def test_smollm2_evidence_fits_the_default_continuation():
    """On the default model and corpus, every kind's query and answer fit `collect`'s default 16 tokens."""
    from polykv_search.data import load_corpus
    from polykv_search.models import load_model

    _, tokenizer = load_model()
    samples = make_calibration_samples(
        tokenizer,
        load_corpus("austen"),
        n_samples=12,
        context_len=512,
        continuation_len=16,
        seed=0,
        mix=parse_retrieval_mix(12),
    )
    for s in samples:
        assert tokenizer.decode(s.continuation_ids[slice(*s.scored)]) == f" {s.answer}"
