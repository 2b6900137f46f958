"""compare reads what `polykv-search score` writes: a real version-2 results file from a tiny local checkpoint."""

from __future__ import annotations

import json

import pytest

from polykv_search import compare as cmp
from polykv_search.cli import main
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.tiny import tiny_model


def test_compare_a_results_file_written_by_score(tmp_path, capsys):
    ckpt = tmp_path / "tiny-qwen2"
    tiny_model("qwen2", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(haystack_texts()[:40])))
    results = tmp_path / "results.json"
    assert (
        main(
            [
                "score",
                "--model",
                str(ckpt),
                "--corpus",
                str(corpus),
                "--baseline",
                "full",
                "--baseline",
                "uniform:snapkv",
                "--baseline",
                "uniform:h2o",
                "--budget",
                "16",
                "--suite",
                "broad/continuation,ruler/niah_single",
                "--samples",
                "3",
                "--context-len",
                "300",
                "--max-new-tokens",
                "4",
                "--out",
                str(results),
            ]
        )
        == 0
    )
    doc = cmp.load_results(results)
    c = cmp.compare([doc], resamples=500)
    assert doc["version"] == 2 and c.runs[0]["engine"] == "shared"
    for r in c.rows:
        assert set(r.suite_iv) == {"broad", "ruler"} and r.suite_iv["broad"].n == 3
        assert r.kl["broad"].estimate == 0.0 if r.is_full else r.kl["broad"].estimate >= 0.0
        assert "ruler" not in r.kl  # KL only on teacher-forced tasks
    snap = next(r for r in c.rows if r.name == "uniform-snapkv")
    assert snap.kl["broad"].estimate == pytest.approx(doc["entries"][1]["extra"]["broad/continuation"]["kl"])
    capsys.readouterr()
    out = tmp_path / "compare.json"
    assert (
        main(
            [
                "compare",
                str(results),
                "--details",
                "--resamples",
                "500",
                "--json",
                str(out),
                "--plot",
                str(tmp_path / "c.png"),
            ]
        )
        == 0
    )
    shown = capsys.readouterr().out
    assert "KL gap" in shown and "uniform-h2o" in shown
    saved = json.loads(out.read_text())
    assert all("fidelity" in r and r["intervals"]["suites"] for r in saved["rows"])
    (rec,) = saved["recommendation"]["budgets"]  # the rule on a real file: the two uniforms are its candidates
    assert rec["candidates"] == ["uniform-snapkv", "uniform-h2o"] and rec["kind"] in ("winner", "tie", "unresolved")
    assert shown.splitlines()[: len(saved["recommendation"]["brief"])] == saved["recommendation"]["brief"]
