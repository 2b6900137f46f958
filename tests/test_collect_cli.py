"""`polykv-search collect` and `show` through the CLI, on a tiny checkpoint: collect, redo, refuse, show, plot."""

from __future__ import annotations

import json

import pytest
from test_collect import (
    assert_tables_close,
    one_thread,  # noqa: F401  (autouse: one intra-op thread)
)
from tiny import tiny_model

from signals import SignalTable
from signals.journal import journal_path


# --------------------------------------------------------------------------- CLI + show
@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(chars)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", layers=2).save_pretrained(path)
    tok.save_pretrained(path)
    corpus = path / "corpus.txt"
    corpus.write_text(
        (
            "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
            "must be in want of a wife.\n"
        )
        * 40
    )
    return path, corpus


def run_cli(argv):
    from polykv_search.cli import main

    return main(argv)


def test_cli_collect_then_show(tiny_checkpoint, tmp_path, capsys):
    ckpt, corpus = tiny_checkpoint
    out = tmp_path / "signals.json"
    argv = [
        "collect",
        "--model",
        str(ckpt),
        "--calib",
        str(corpus),
        "--samples",
        "2",
        "--context-len",
        "40",
        "--continuation-len",
        "4",
        "--patterns",
        "snapkv,streaming_llm",
        "--budgets",
        "8,16",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert run_cli(argv) == 0
    table = SignalTable.load(out)
    assert table.is_complete() and table.num_layers == 2
    prov = table.provenance
    assert prov["calibration"]["spec"] == str(corpus) and prov["calibration"]["n_samples"] == 2
    assert prov["n_samples"] == 2 and prov["context_len"] == 40 and prov["config_hash"]
    assert "timings" in prov and prov["method"] == "replay"
    capsys.readouterr()

    png = tmp_path / "signals.png"
    assert run_cli(["show", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "best pattern per layer" in text and "most sensitive layers" in text and "entropy" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the same command again finds the finished table and does nothing; --fresh recomputes it
    before = out.stat().st_mtime_ns
    assert run_cli(argv) == 0
    # (the console wraps long lines, so compare with whitespace collapsed)
    assert "nothing to do" in " ".join(capsys.readouterr().err.split()) and out.stat().st_mtime_ns == before
    assert run_cli(argv + ["--fresh"]) == 0
    assert SignalTable.load(out).digest() == table.digest()
    # --resume insists on a partial run
    assert run_cli(argv + ["--resume"]) == 2
    assert "nothing to resume" in " ".join(capsys.readouterr().err.split())


@pytest.mark.slow
def test_cli_jobs_load_the_model_by_name_in_each_worker(tiny_checkpoint, tmp_path):
    ckpt, corpus = tiny_checkpoint
    common = [
        "collect",
        "--model",
        str(ckpt),
        "--calib",
        str(corpus),
        "--samples",
        "2",
        "--context-len",
        "40",
        "--continuation-len",
        "4",
        "--patterns",
        "snapkv,h2o",
        "--budgets",
        "8,16",
        "--no-progress",
    ]
    assert run_cli(common + ["--out", str(tmp_path / "a.json")]) == 0
    assert run_cli(common + ["--out", str(tmp_path / "b.json"), "--jobs", "2"]) == 0
    a, b = SignalTable.load(tmp_path / "a.json"), SignalTable.load(tmp_path / "b.json")
    assert_tables_close(a, b, tol=1e-6)
    assert b.provenance["timings"]["jobs"] == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--patterns", "snapkv,bogus"], "unknown pattern 'bogus'"),
        (["--budgets", "8,x"], "budgets"),
        (["--phases", "prefill,train"], "phases"),
        (["--continuation-len", "1"], "continuation-len"),
        (["--samples", "500"], "too short"),
        (["--layers", "9"], "out of range"),
    ],
)
def test_cli_bad_input_exits_2_without_output(tiny_checkpoint, tmp_path, capsys, extra, message):
    ckpt, corpus = tiny_checkpoint
    out = tmp_path / "signals.json"
    argv = [
        "collect",
        "--model",
        str(ckpt),
        "--calib",
        str(corpus),
        "--samples",
        "1",
        "--context-len",
        "40",
        "--continuation-len",
        "4",
        "--patterns",
        "snapkv",
        "--budgets",
        "8",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert run_cli(argv + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists() and not journal_path(out).exists()


def test_show_on_a_partial_table_and_bad_plot_path(tmp_path, capsys):
    from signals import random_signal_table

    table = random_signal_table(num_layers=4, missing=0.3, seed=1)
    path = tmp_path / "t.json"
    table.save(path)
    assert run_cli(["show", str(path)]) == 0
    assert "most sensitive layers" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "polykv-signals", "version": 99}))
    assert run_cli(["show", str(bad)]) == 2


def test_show_marks_the_cells_indistinguishable_from_fullkv(tmp_path, capsys):
    from signals import random_signal_table

    table = random_signal_table(num_layers=5, samples=3, noise=0.5, seed=4)
    path = table.save(tmp_path / "t.json")
    png = tmp_path / "t.png"
    assert run_cli(["show", str(path), "--plot", str(png)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    same = table.indistinguishable("dppl")
    for f, phase in enumerate(table.phases):
        n = int(same[:, f].sum())
        assert 0 < n < same[:, f].size
        assert f"{phase}: {n} of {same[:, f].size} cells are indistinguishable from FullKV" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = table.to_json()
    doc["version"] = 1
    for key in ("kl", "uncertainty"):
        doc.pop(key)
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(doc))
    assert run_cli(["show", str(old)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "no standard errors in this table" in text and "indistinguishable" not in text
