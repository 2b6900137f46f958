"""Bad input refused up front (issue 30): impossible evidence requests, unusable score checkpoints, lm-eval
model arguments, quickstart and optuna arguments, analyses a signal table cannot serve, flags a format ignores.

Each CLI row runs as the corpus of ``test_bad_inputs_cases.py`` does (exit code 2, one ``error:`` line, no
traceback, nothing written); no model is loaded (``ModelLoaded``), and a hang fails the test (``time_limit``).
"""

from __future__ import annotations

import pytest
import torch

from tests.bad_inputs_support import (
    READ_ONLY,
    RES,
    SIG,
    S,
    make,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    ro,
    row,
    run_case,
    snapshot,
    time_limit,  # noqa: F401  (autouse: a hang fails the test)
)

OPTUNA = "solve --method optuna --signals sig.json --budget 64 --out o.json --storage"
SEARCH = "solve --method search --signals sig.json --budget 64 --out o.json"
SCORE = "score --baseline full --out o/r.json"  # one entry, the default suites


def partial(kind: str) -> dict[str, str]:
    return {"o/r.json.partial": kind}


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")

CASES = [
    # ---- evidence generator: what its vocabularies can supply, checked before anything is drawn
    row(
        "collect --retrieval-mix 1 --evidence-records 40 --out o.json",
        "record sample can hold",
        id="collect-40-records",
    ),
    row("collect --retrieval-mix 1 --evidence-records 1000 --out o.json", "at most 39", id="collect-1000-records"),
    row("collect --retrieval-mix 3 --evidence-records 20 --out o.json", "at most 19", id="collect-20-records-3-kinds"),
    row(
        "collect --retrieval-mix 1 --evidence-records 39 --context-len 128 --budgets 32,64 --out o.json",
        "--context-len 128 is too short for 39 evidence records",
        id="collect-records-over-half-the-context",
    ),
    # ---- score: the checkpoint is read through one validating reader, before the model loads
    row(
        SCORE, "r.json.partial: line 1: not a checkpoint header", partial("partial-list-head"), id="score-partial-list"
    ),
    row(SCORE, "line 2: index must be", partial("partial-no-index"), id="score-partial-no-index"),
    row(SCORE, "line 2: rows has 0 entries' results", partial("partial-empty-rows"), id="score-partial-empty-rows"),
    row(SCORE, "line 2: rows[0].record.prediction", partial("partial-no-prediction"), id="score-partial-no-prediction"),
    row(SCORE, "line 2: NaN is not a valid JSON number", partial("partial-nan-wall"), id="score-partial-nan"),
    row(SCORE, "line 2: not JSON", partial("partial-garbage-line"), id="score-partial-garbage-line"),
    row(
        SCORE, "'ruler/nosuch' is not one of this run's tasks", partial("partial-unknown-task"), id="score-partial-task"
    ),
    row(
        SCORE,
        "line 3: sample 0 of ruler/niah_single is there twice",
        partial("partial-twice"),
        id="score-partial-twice",
    ),
    row(SCORE, "r.json.partial: not UTF-8 text", partial("partial-latin1"), id="score-partial-not-utf8"),
    row(SCORE, "cannot read o/r.json.partial", partial("dir"), id="score-partial-is-dir"),
    # ---- quickstart: every step's arguments before the output folder is made
    row("quickstart --device cuda --out q", "CUDA is not available", id="quickstart-cuda-missing", marks=no_cuda),
    row("quickstart --patterns nosuch --out q", "unknown pattern 'nosuch'", id="quickstart-unknown-pattern"),
    row(
        "quickstart --budgets 32,1024 --out q", "must exceed the largest of --budgets", id="quickstart-budget-over-ctx"
    ),
    row("quickstart --model ./no/such --out q", "does not exist", id="quickstart-model-missing"),
    row("quickstart --device tpu --out q", "invalid device 'tpu'", id="quickstart-bad-device"),
    # ---- solve --method optuna: the storage before the scoring model loads
    row(f"{OPTUNA} bad://x", "storage bad://x", SIG, id="solve-optuna-storage-bad-url"),
    row(f"{OPTUNA} d", "is a directory", {**SIG, "d": "dir"}, id="solve-optuna-storage-is-dir"),
    row(f"{OPTUNA} sqlite:///no/such/folder/s.db", "does not exist", SIG, id="solve-optuna-sqlite-folder-missing"),
    row(f"{OPTUNA} {READ_ONLY}", "cannot write in /proc", SIG, id="solve-optuna-storage-read-only", marks=ro),
    # ---- solve --method search: its settings and its start before the model loads
    row(f"{SEARCH} --start no.json", "start: strategy: cannot read no.json", SIG, id="solve-search-start-missing"),
    row(f"{SEARCH} --start s.json --budget 32", "has 4 layers at B=64.0", {**SIG, **S}, id="search-start-b"),
    row(f"{SEARCH} --start-settings objective", "'objective' is not KEY=VALUE", SIG, id="solve-search-start-settings"),
    row(f"{SEARCH} --start-settings objective=x", "objective: 'x' is not one of", SIG, id="solve-search-start-value"),
    row(f"{SEARCH} --step 0", "step: a share of B in (0, 1]", SIG, id="solve-search-step-0"),
    row(f"{SEARCH} --batch-entries 0", "batch_entries: must be at least 1", SIG, id="solve-search-batch-entries-0"),
    row(f"{SEARCH} --journal d", "--journal d: is a directory", {**SIG, "d": "dir"}, id="solve-search-journal-dir"),
    row(
        "solve --budget 64 --signals bad.json --out o.json",
        "nan); a missing value is null (in bad.json)",
        {"bad.json": "signals-nan-cell"},
        id="solve-nan-cell-names-the-file",
    ),
    # ---- compare --signals: the analysis asked for needs the table's signal
    row("compare r.json --signals v1.json", "has no 'kl' signal", {**RES, "v1.json": "signals-v1"}, id="compare-no-kl"),
    row(
        "compare r.json --signals v1.json --objective kl --json c.json",
        "--objective kl",
        {**RES, "v1.json": "signals-v1"},
        id="compare-no-kl-json",
    ),
    # ---- export: a flag that does nothing for the format is refused
    row(
        "export s.json --format json --approximate --out o.json",
        "--approximate does not apply",
        S,
        id="export-json-approx",
    ),
    row(  # kvpress reads --approximate (head groups) but not --max-seq-len
        "export s.json --format kvpress --max-seq-len 64 --out p.py",
        "--max-seq-len does not apply to --format kvpress",
        S,
        id="export-kvpress-max-seq-len",
    ),
    # ---- show: the file is named
    row(
        "show bad.json",
        "cosine[0][0][0][0]: not a finite number (nan); a missing value is null (in bad.json)",
        {"bad.json": "signals-nan-cell"},
        id="show-nan-cell-names-file",
    ),
]


@pytest.mark.parametrize("argv,match,files", CASES)
def test_bad_input_is_refused_up_front(argv, match, files, tmp_path, monkeypatch, capsys):
    run_case(argv, match, files, tmp_path, monkeypatch, capsys)


def test_clean_versions_pass_the_checks_and_reach_the_model(tmp_path, monkeypatch, capsys):
    """The same command lines with good values get past every check (to the model load)."""
    from polykv_search.cli import main
    from tests.bad_inputs_support import ModelLoaded

    monkeypatch.chdir(tmp_path)
    make("signals", tmp_path / "sig.json")
    make("partial", tmp_path / "o" / "r.json.partial")
    make("strategy", tmp_path / "s.json")
    for argv in (
        f"{SEARCH} --start s.json --b-min 1 --model smollm2-135m",  # the start file was solved at b_min 1
        "collect --retrieval-mix 3 --evidence-records 19 --out o.json",
        SCORE,
        f"{OPTUNA} {tmp_path / 'study.journal'} --model smollm2-135m",
        "quickstart --out q",
    ):
        with pytest.raises(ModelLoaded):
            main(argv.split())
    assert not (tmp_path / "study.journal").exists() and not (tmp_path / "o.json").exists()
    assert not (tmp_path / "o.json.journal").exists()


# --------------------------------------------------------------------------------------------
# lm-eval: the polykv model arguments, checked after lm-eval parses its flags and before it runs

LM_CASES = [
    ("strategy=uniform:snapkv,budget=nan", "got nan"),
    ("strategy=uniform:snapkv,budget=inf", "got inf"),
    ("strategy=uniform:snapkv,budget=0", "positive integer, got 0"),
    ("strategy=uniform:snapkv,budget=1.5", "positive integer, got 1.5"),
    ("strategy=uniform:snapkv", "needs budget=B"),
    ("strategy=uniform:nosuch,budget=64", "unknown pattern 'nosuch'"),
    ("strategy=missing.json", "cannot read missing.json"),
    ("strategy=bad.json", "bad.json: not UTF-8 text"),
    ("strategy=s.json,budget=64", "budget=64 applies only to strategy=uniform"),
    ("strategy=uniform:snapkv,budget=64,decode_interval=0", "decode_interval must be a positive integer"),
    ("strategy=full,interval_mode=sideways", "interval_mode must be one of within, over"),
    ("pretrained=./no/such", "does not exist"),
]


@pytest.mark.parametrize("model_args,match", LM_CASES, ids=[a for a, _ in LM_CASES])
def test_polykv_lm_eval_refuses_bad_model_args_in_one_line_before_anything_runs(
    model_args, match, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("lm_eval")
    import lm_eval.utils

    from polykv_search.integrations.lm_eval_cli import main as lm_eval_main

    monkeypatch.setattr(lm_eval.utils, "setup_logging", lambda *a, **k: None)  # no global logging set-up here
    monkeypatch.chdir(tmp_path)
    make("latin1", tmp_path / "bad.json")
    make("strategy", tmp_path / "s.json")
    before = snapshot(tmp_path)
    argv = ["--model", "polykv", "--model_args", model_args, "--tasks", "hellaswag", "--output_path", "out"]
    assert lm_eval_main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("polykv-lm-eval: error: argument --model_args: ") and err.count("\n") == 1, err
    assert match in err and "Traceback" not in out + err
    assert snapshot(tmp_path) == before


def test_the_polykv_model_type_checks_its_arguments_before_loading(tmp_path):
    pytest.importorskip("lm_eval")
    from polykv_search.integrations.lm_eval_model import PolyKVLM
    from strategies import StrategyError

    for kwargs in (
        {"strategy": "uniform:snapkv", "budget": float("nan")},
        {"strategy": "uniform:nosuch", "budget": 8},
        {"strategy": str(tmp_path / "missing.json")},
    ):
        with pytest.raises(StrategyError):  # a ValueError, as lm-eval's models raise; before ModelLoaded
            PolyKVLM(pretrained="smollm2-135m", **kwargs)
