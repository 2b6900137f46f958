"""`polykv-search score` end to end on a tiny local checkpoint: the shared engine (default) and the
per-entry reference path write the same scores; the results file is version 2 with fidelity."""

from __future__ import annotations

import json

import pytest
import torch

from polykv_search.cli import main
from tests.models_support import saved_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return saved_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"))


def score_argv(checkpoint, out, *extra) -> list[str]:
    ckpt, corpus = checkpoint
    return [
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
        "5",
        "--out",
        str(out),
        *extra,
    ]


def score(checkpoint, out, *extra):
    assert main(score_argv(checkpoint, out, *extra)) == 0
    return json.loads(out.read_text())


def test_shared_and_per_entry_paths_write_the_same_scores(checkpoint, tmp_path, capsys):
    shared = score(checkpoint, tmp_path / "shared.json")
    assert "uniform-snapkv" in capsys.readouterr().out  # the run's table
    per = score(checkpoint, tmp_path / "per.json", "--no-shared-prefill", "--batch-entries", "2", "--no-table")
    assert "uniform-snapkv" not in capsys.readouterr().out  # --no-table: the quickstart prints it once, later
    assert shared["version"] == 2 and shared["provenance"]["engine"] == "shared"
    assert per["provenance"]["engine"] == "per-entry"
    for a, b in zip(shared["entries"], per["entries"]):
        assert a["name"] == b["name"] and a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
        for task, result in a["tasks"].items():
            assert [r["score"] for r in result["per_sample"]] == [r["score"] for r in b["tasks"][task]["per_sample"]]
        kl = a["extra"]["broad/continuation"]["kl"]
        assert kl == pytest.approx(b["extra"]["broad/continuation"]["kl"], abs=1e-6)
        assert (kl == 0.0) == (a["name"] == "full")
    assert shared["provenance"]["timing"]["total_s"] > 0
    assert shared["provenance"]["execution"] == {"jobs": 1, "backend": "in-process", "threads": torch.get_num_threads()}


def test_bad_baselines_and_outputs_are_refused_before_the_model_loads(checkpoint, tmp_path, capsys):
    ckpt, corpus = checkpoint
    base = ["score", "--model", str(tmp_path / "no-such-model"), "--corpus", str(corpus)]
    cases = [
        (["--baseline", "bogus", "--out", str(tmp_path / "r.json")], "unknown baseline"),
        (["--baseline", "uniform:snapkv", "--out", str(tmp_path / "r.json")], "needs --budget"),
        (["--baseline", "full", "--out", str(tmp_path)], "is a directory"),
        (["--baseline", "full", "--suite", "nosuch", "--out", str(tmp_path / "r.json")], "nosuch"),
    ]
    for extra, message in cases:
        capsys.readouterr()
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in " ".join(err.split()) and "Traceback" not in err
        assert not (tmp_path / "r.json").exists()


def test_split_calib_draws_the_samples_from_the_calibration_documents(checkpoint, tmp_path):
    """``--split calib`` (for designing on calibration samples) draws other samples than the default evaluation
    split, and the results file says which split it used."""
    argv = ["--suite", "broad/continuation", "--samples", "2", "--no-table"]
    default = score(checkpoint, tmp_path / "eval.json", *argv)
    calib = score(checkpoint, tmp_path / "calib.json", *argv, "--split", "calib")
    split = calib["provenance"]["eval_split"]
    assert default["provenance"]["eval_split"]["role"] == "eval" and split["role"] == "calib"
    assert split["documents"] == split["calib"] and not set(split["documents"]) & set(split["eval"])
    tasks = "broad/continuation"
    assert calib["provenance"]["tasks"][tasks]["samples"] != default["provenance"]["tasks"][tasks]["samples"]
