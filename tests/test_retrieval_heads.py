"""Retrieval scores per KV head (Wu et al.'s copy-attention, teacher-forced): a hand-built attention map
with a known answer, the copy positions of real evidence samples, and a tiny model end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny import tiny_model

from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix
from signals.retrieval_heads import copy_pairs, head_hits, kv_head_scores, retrieval_scores
from tests.conftest import benchmark_script
from tests.test_retrieval_calibration import M, N, char_tokenizer, toy_corpus


def test_hits_on_a_hand_built_attention_map():
    L, hq, T = 2, 4, 10
    pairs = [(6, 2), (7, 3)]  # the query at 6 predicts a token copied from 2, the one at 7 from 3
    att = torch.full((L, hq, T, T), 0.01)
    att[0, 1, 6, 2] = att[0, 1, 7, 3] = 0.9  # layer 0, head 1: copies both
    att[0, 2, 6, 2] = att[0, 2, 7, 5] = 0.9  # head 2: one of two
    att[1, 3, 6, 0] = att[1, 3, 7, 0] = 0.9  # layer 1, head 3: a sink head, never the source
    hits = head_hits(list(att), pairs)
    want = torch.zeros(L, hq)
    want[0, 1], want[0, 2] = 1.0, 0.5
    assert torch.equal(hits, want)
    # query heads (0, 1) read KV head 0, (2, 3) KV head 1: a KV head scores its best query head
    assert torch.equal(kv_head_scores(hits, 2), torch.tensor([[1.0, 0.5], [0.0, 0.0]]))


@pytest.fixture(scope="module")
def evidence():
    mix = parse_retrieval_mix("1.0")
    kw = dict(n_samples=3, context_len=N, continuation_len=M, mix=mix, seed=0)
    return make_calibration_samples(char_tokenizer(), toy_corpus(), **kw)


def test_copy_pairs_point_from_the_predicting_query_to_the_answer_in_its_statement(evidence):
    for s in evidence:
        ids = list(s.context_ids) + list(s.continuation_ids)
        pairs = copy_pairs(s)
        start, end = s.scored
        assert len(pairs) == end - start
        a, b = s.evidence_spans[s.queried]
        for i, (q, src) in enumerate(pairs):
            assert q == N + start + i - 1  # the position before answer token i
            assert ids[q + 1] == ids[src] and a <= src < b  # the token it predicts, found in the statement


def test_scores_of_a_tiny_model_are_shares_with_standard_errors(evidence):
    model = tiny_model("llama", layers=2)
    seen = []
    scores = retrieval_scores(model, evidence, on_sample=lambda: seen.append(1))
    assert scores.mean.shape == (2, 2) and scores.per_sample.shape == (3, 2, 2) and len(seen) == 3
    assert ((scores.per_sample >= 0) & (scores.per_sample <= 1)).all() and np.isfinite(scores.se).all()
    np.testing.assert_allclose(scores.mean, scores.per_sample.mean(axis=0))
    assert model.config._attn_implementation == "sdpa"  # the eager kernel was only borrowed
    assert len(scores.top(3)) == 3 and scores.top(1)[0][2] == scores.mean.max()


def test_the_script_refuses_bad_input_in_one_line(capsys):
    script = benchmark_script("retrieval_heads")
    assert script.main(["--samples", "1"]) == 2
    assert script.main(["--samples", "4", "--records", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.startswith("error: ")


# ------------------------------------------------------------------------- in the signal table
def _table_with_heads(scores):
    from signals import SignalTable
    from signals.head_signals import HeadSignals

    table = SignalTable.empty(2, ["prefill"], ["snapkv"], [8], {"model": "tiny"})
    table.set_heads(HeadSignals(scores, {"samples": scores.n_samples, "records": 1}))
    return table


def test_the_table_round_trips_head_signals_as_version_3_and_stays_version_2_without(evidence):
    from signals import SignalTable

    scores = retrieval_scores(tiny_model("llama", layers=2), evidence)
    table = _table_with_heads(scores)
    doc = table.to_json()
    assert doc["version"] == 3 and doc["heads"]["num_kv_heads"] == 2
    back = SignalTable.loads(table.dumps())
    assert back == table and back.heads.retrieval.per_sample.shape == (3, 2, 2)
    table.set_heads(None)
    assert table.to_json()["version"] == 2 and "heads" not in table.to_json()
    assert SignalTable.loads(table.dumps()).heads is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["heads"]["retrieval"]["mean"][0].__setitem__(0, 1.5), "share in \\[0, 1\\]"),
        (lambda d: d["heads"]["retrieval"]["mean"].pop(), "expected 2 layers"),
        (lambda d: d["heads"].__setitem__("num_kv_heads", 0), "positive integer"),
        (lambda d: d.__setitem__("version", 2), "unknown keys \\['heads'\\]"),
    ],
)
def test_bad_head_blocks_are_refused_naming_the_field(evidence, edit, message):
    from signals import SignalTable, SignalTableError

    doc = _table_with_heads(retrieval_scores(tiny_model("llama", layers=2), evidence[:2])).to_json()
    edit(doc)
    with pytest.raises(SignalTableError, match=message):
        SignalTable.from_json(doc)


def test_collect_measures_retrieval_heads_and_show_draws_them(tmp_path, capsys):
    from test_collect_cli import run_cli

    from signals import SignalTable

    ckpt = tmp_path / "tiny"
    tiny_model("llama", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    corpus = tmp_path / "corpus.txt"
    lines = [f"The {m} path went on for mile {i}. Nobody said much." for m in "abcdef" for i in range(40)]
    corpus.write_text("\n".join(lines))
    out = tmp_path / "signals.json"
    argv = ["collect", "--model", str(ckpt), "--calib", str(corpus), "--samples", "2", "--context-len", "300"]
    argv += ["--continuation-len", "48", "--patterns", "snapkv", "--budgets", "64", "--phases", "prefill"]
    argv += ["--layers", "0", "--retrieval-heads", "3", "--out", str(out), "--no-progress"]
    assert run_cli(argv) == 0
    heads = SignalTable.load(out).heads
    assert heads.retrieval.n_samples == 3 and heads.provenance["records"] == 1 and heads.num_kv_heads == 2
    capsys.readouterr()
    png = tmp_path / "s.png"
    assert run_cli(["show", str(out), "--plot", str(png)]) == 0
    assert "retrieval heads: strongest (mean ± SE): L" in capsys.readouterr().out
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = argv[:-5] + ["--retrieval-heads", "1", "--out", str(tmp_path / "x.json"), "--no-progress"]
    assert run_cli(bad) == 2 and not (tmp_path / "x.json").exists()
    assert "at least 2 samples" in capsys.readouterr().err
    # the measurement script on the same checkpoint and corpus: table, JSON and heatmap
    script = benchmark_script("retrieval_heads")
    doc_path, png = tmp_path / "rh.json", tmp_path / "rh.png"
    argv = ["--model", str(ckpt), "--calib", str(corpus), "--samples", "2", "--context-len", "300"]
    assert script.main([*argv, "--continuation-len", "48", "--json", str(doc_path), "--plot", str(png)]) == 0
    doc = json.loads(doc_path.read_text())
    assert len(doc["mean"]) == 2 and len(doc["mean"][0]) == 2 and 0 <= doc["top5pct_share"] <= 1
    assert png.read_bytes()[:4] == b"\x89PNG" and "top 4 KV heads" in capsys.readouterr().out
