"""The streaming cells in the signal table: version 4 round trip, version 3 unchanged, errors naming the
field; `collect --head-cells` and `show`."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from tiny import tiny_model

from signals import SignalTable, SignalTableError
from signals.head_signals import HeadCells, HeadSignals
from signals.retrieval_heads import RetrievalScores

L, H = 2, 3


def head_signals(cells: bool = True, se_nan: bool = False) -> HeadSignals:
    rng = np.random.default_rng(0)
    per = rng.uniform(0, 1, (3, L, H))
    scores = RetrievalScores(per.mean(0), per.std(0, ddof=1) / np.sqrt(3), per)
    arrays = [rng.uniform(0, 0.5, (L, H, 2)) for _ in range(4)]
    if se_nan:
        arrays[1][:] = arrays[3][:] = np.nan
    hc = HeadCells(4, (16, 32), *arrays, {"evidence_samples": 3, "prose_samples": 1}) if cells else None
    return HeadSignals(scores, {"samples": 3, "records": 1}, hc)


def table(heads=None) -> SignalTable:
    t = SignalTable.empty(L, ["prefill"], ["snapkv"], [8], {"model": "tiny"})
    t.set_heads(heads)
    return t


@pytest.mark.parametrize("se_nan", [False, True])
def test_a_table_with_cells_round_trips_as_version_4(se_nan):
    t = table(head_signals(se_nan=se_nan))
    doc = t.to_json()
    assert doc["version"] == 4
    cells = doc["heads"]["cells"]
    assert sorted(cells) == ["budgets", "kl_answer", "kl_prose", "pattern", "provenance", "sink"]
    assert cells["pattern"] == "streaming_llm" and cells["sink"] == 4 and cells["budgets"] == [16, 32]
    assert sorted(cells["kl_answer"]) == ["mean", "se"] and np.array(cells["kl_prose"]["mean"]).shape == (L, H, 2)
    back = SignalTable.loads(t.dumps())
    assert back == t and back.heads.cells == t.heads.cells and back.dumps() == t.dumps()
    assert back.heads.cells.budgets == (16, 32)


def test_version_3_tables_load_unchanged_and_are_still_written_as_version_3():
    t = table(head_signals(cells=False))
    text = t.dumps()
    assert json.loads(text)["version"] == 3
    back = SignalTable.loads(text)
    assert back.heads.cells is None and back == t and back.dumps() == text
    assert table().to_json()["version"] == 2


def test_cells_in_a_version_3_table_are_refused():
    doc = table(head_signals()).to_json()
    doc["version"] = 3
    with pytest.raises(SignalTableError, match=r"^heads: unknown keys \['cells'\] for version 3"):
        SignalTable.from_json(doc)


def _edit(path, value):
    def edit(doc):
        node = doc["heads"]["cells"]
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_edit(["pattern"], "h2o"), r"heads\.cells\.pattern: must be 'streaming_llm'"),
        (_edit(["sink"], -1), r"heads\.cells\.sink: must be a non-negative integer"),
        (_edit(["sink"], True), r"heads\.cells\.sink"),
        (_edit(["budgets"], [32, 16]), r"heads\.cells\.budgets: must be strictly increasing"),
        (_edit(["budgets"], [4, 32]), r"heads\.cells\.budgets: every budget must exceed the sink \(4\)"),
        (_edit(["budgets"], [16]), r"heads\.cells\.kl_answer\.mean\[0\]\[0\]: expected 1 budgets, got 2"),
        (_edit(["kl_answer", "mean", 0], [[0.1, 0.1]] * 2), r"heads\.cells\.kl_answer\.mean\[0\]: expected 3 KV"),
        (_edit(["kl_prose", "mean", 1, 2, 0], None), r"heads\.cells\.kl_prose\.mean: every cell needs a value"),
        (_edit(["kl_prose", "se", 1, 2, 0], -0.5), r"heads\.cells\.kl_prose\.se: values must be >= 0"),
        (_edit(["kl_answer", "mean", 0, 0, 0], "inf"), r"heads\.cells\.kl_answer\.mean\[0\]\[0\]\[0\]: not a finite"),
        (_edit(["kl_answer", "se"], KeyError), r"heads\.cells\.kl_answer: expected an object with the keys mean, se"),
        (_edit(["provenance"], KeyError), r"heads\.cells: expected an object with the keys budgets, kl_answer"),
        (_edit(["provenance"], []), r"heads\.cells\.provenance: must be an object"),
        (_edit(["extra"], 1), r"heads\.cells: expected an object with the keys"),
    ],
)
def test_bad_cells_are_refused_naming_the_field(edit, message):
    doc = table(head_signals()).to_json()
    edit(doc)
    with pytest.raises(SignalTableError, match=message):
        SignalTable.from_json(copy.deepcopy(doc))


def test_cells_of_another_shape_than_the_retrieval_scores_are_refused():
    hs = head_signals()
    c = hs.cells
    small = HeadCells(4, (16, 32), *(a[:, :2] for a in c.arrays))
    with pytest.raises(SignalTableError, match=r"^heads\.cells: \(2, 2\) \(layers, KV heads\)"):
        HeadSignals(hs.retrieval, {}, small)


def test_collect_measures_head_cells_and_show_lists_the_costliest(tmp_path, capsys):
    from test_collect_cli import run_cli
    from test_retrieval_calibration import char_tokenizer

    ckpt = tmp_path / "tiny"
    tiny_model("llama", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    corpus = tmp_path / "corpus.txt"
    lines = [f"The {m} path went on for mile {i}. Nobody said much." for m in "abcdef" for i in range(40)]
    corpus.write_text("\n".join(lines))
    out = tmp_path / "signals.json"
    argv = ["collect", "--model", str(ckpt), "--calib", str(corpus), "--samples", "2", "--context-len", "300"]
    argv += ["--continuation-len", "48", "--patterns", "snapkv", "--budgets", "64", "--phases", "prefill"]
    argv += ["--layers", "0", "--no-progress"]
    assert run_cli([*argv, "--retrieval-heads", "2", "--head-cells", "16,8", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 4
    heads = SignalTable.load(out).heads
    cells = heads.cells
    assert heads.retrieval.n_samples == 2 and cells.budgets == (8, 16) and cells.sink == 4
    assert cells.provenance["evidence_samples"] == 2 and cells.provenance["prose_samples"] == 2
    assert cells.kl_answer_mean.shape == (2, 2, 2) and (cells.kl_answer_mean >= 0).all()
    assert np.isfinite(cells.kl_prose_se).all() and cells.provenance["evidence"] == heads.provenance
    assert "streaming cells: budgets 8,16 on 2 evidence + 2 prose samples" in " ".join(capsys.readouterr().err.split())
    png = tmp_path / "s.png"
    assert run_cli(["show", str(out), "--plot", str(png)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "streaming cells: costliest at b=8 (answer KL mean ± SE): L" in shown
    assert png.read_bytes()[:4] == b"\x89PNG"
    # rerun with the same settings: nothing measured again; other budgets: the cells only, same retrieval scores
    assert run_cli([*argv, "--retrieval-heads", "2", "--head-cells", "8,16", "--out", str(out)]) == 0
    assert "streaming cells" not in capsys.readouterr().err and SignalTable.load(out).heads == heads
    assert run_cli([*argv, "--retrieval-heads", "2", "--head-cells", "--out", str(out)]) == 0  # default budgets
    again = SignalTable.load(out).heads
    assert again.cells.budgets == (32, 64, 128) and again.retrieval.mean.tolist() == heads.retrieval.mean.tolist()
    capsys.readouterr()
    # bad input: one line, exit 2, nothing written
    for extra, message in [
        (["--head-cells", "4,8"], "budgets must exceed the 4 sinks"),
        (["--head-cells", "300"], "budgets must be below --context-len 300"),
        (["--head-cells", "8", "--retrieval-mix", "2"], "needs prose samples"),
        (["--head-cells", "8,8"], "repeated budget"),
    ]:
        bad = tmp_path / "bad.json"
        assert run_cli([*argv, *extra, "--out", str(bad)]) == 2 and not bad.exists()
        err = capsys.readouterr().err
        assert message in err and err.count("\n") <= 2, err


def test_head_cells_alone_measure_the_default_evidence_samples():
    from argparse import Namespace

    from polykv_search.cli.collect_heads import DEFAULT_HEAD_SAMPLES, head_samples

    assert head_samples(Namespace(retrieval_heads=0, head_cells=[32])) == DEFAULT_HEAD_SAMPLES == 8
    assert head_samples(Namespace(retrieval_heads=3, head_cells=[32])) == 3
    assert head_samples(Namespace(retrieval_heads=0, head_cells=None)) == 0


def test_the_benchmark_script_refuses_bad_input_and_reports_on_a_tiny_model(tmp_path, capsys):
    from test_retrieval_calibration import char_tokenizer

    from tests.conftest import benchmark_script

    script = benchmark_script("head_cells")
    assert script.main(["--budgets", "4,8"]) == 2 and script.main(["--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.startswith("error: ")
    ckpt = tmp_path / "tiny"
    tiny_model("llama", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    corpus = tmp_path / "corpus.txt"
    lines = [f"The {m} path went on for mile {i}. Nobody said much." for m in "abc" for i in range(40)]
    corpus.write_text("\n".join(lines))
    doc_path = tmp_path / "hc.json"
    argv = ["--model", str(ckpt), "--calib", str(corpus), "--samples", "2", "--prose-samples", "1"]
    argv += ["--context-len", "300", "--continuation-len", "48", "--budgets", "16,32", "--json", str(doc_path)]
    assert script.main(argv) == 0
    doc = json.loads(doc_path.read_text())
    assert doc["budgets"] == [16, 32] and np.array(doc["kl_answer_mean"]).shape == (2, 2, 2)
    assert [row["budget"] for row in doc["per_budget"]] == [16, 32] and "Spearman" in capsys.readouterr().out


@pytest.mark.parametrize("layers_collected", [1, 2])
def test_show_names_a_head_level_tables_one_cell_grid_a_placeholder(tmp_path, capsys, layers_collected):
    from test_collect_cli import run_cli

    t = table(head_signals())
    for layer in range(layers_collected):
        t.set_cell(layer, "prefill", "snapkv", 8, cosine=0.99, dppl=0.1, kl=0.01)
    path = t.save(tmp_path / "heads.json")
    assert run_cli(["show", str(path)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "streaming cells: costliest at b=16" in shown  # the head-level signals, either way
    placeholder = "layer grid: one placeholder cell, as a head-level collect writes it" in shown
    assert placeholder == (layers_collected == 1)  # a grid with layer-level signals is shown as before
    assert ("entropy" in shown) == (layers_collected == 2)
