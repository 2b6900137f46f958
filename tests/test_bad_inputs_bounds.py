"""Bad input refused before any work (reliability fixes): counts with no sane bound, and checks that need no model
run before the model loads.

Each row runs as the corpus of ``test_bad_inputs_cases.py`` does (exit code 2, one ``error:`` line, no traceback,
nothing written); no model is loaded (``ModelLoaded``), and a hang fails the test (``time_limit``).
"""

from __future__ import annotations

import argparse

import pytest

from tests.bad_inputs_support import (
    RES,
    SIG,
    S,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    row,
    run_case,
    time_limit,  # noqa: F401  (autouse: a hang fails the test)
)

SOLVE = "solve --method uniform --budget 64 --out o.json"

CASES = [
    # ---- solve --num-layers: a strategy of 10**8 layers would run for hours and fill the memory
    row(f"{SOLVE} --num-layers 100000000", "expected at most 10,000 layers, got 100,000,000", id="solve-layers-1e8"),
    row(f"{SOLVE} --num-layers 10001", "at most 10,000 layers", id="solve-layers-over-the-cap"),
    row(f"{SOLVE} --num-layers 0", "expected a positive integer, got 0", id="solve-layers-0"),
    row(f"{SOLVE} --num-layers inf", "expected a positive integer, got 'inf'", id="solve-layers-inf"),
    row(
        "solve --budget 64 --signals sig.json --num-layers 100000000 --out o.json",
        "at most 10,000 layers",
        SIG,
        id="solve-layers-1e8-with-signals",
    ),
    # ---- score --samples (quickstart --eval-samples): generated and held before the first is scored
    row("score --baseline full --samples 100000000000 --out o.json", "at most 10,000 samples", id="score-samples-1e11"),
    row("quickstart --eval-samples 10001 --out q", "at most 10,000 samples per task", id="quickstart-eval-samples"),
    row("score --baseline full --seed -1 --out o.json", "expected a non-negative integer, got -1", id="score-seed-neg"),
    # ---- inputs read before any model or tokenizer loads
    row("collect --calib '' --out o.json", "--calib: empty", id="collect-calib-empty"),
    row(
        "score --baseline full --suite longbench --longbench-source nosuch --out o.json",
        "nosuch: no such file or directory",
        id="score-longbench-source-missing",
    ),
    # ---- compare --resamples: scipy holds every resample's indices at once
    row("compare r.json --resamples 1000000000000", "at most 1,000,000 resamples", RES, id="compare-resamples-1e12"),
    row("compare r.json --resamples 0", "expected a positive integer, got 0", RES, id="compare-resamples-0"),
    # ---- export: an output (or the kvpress module's JSON sidecar) that would replace the strategy it reads
    # (canonical JSON in place keeps the strategy: test_bad_inputs_outputs.py)
    row(
        "export s.json --format vllm --approximate --out s.json",
        "--out s.json is the strategy file",
        S,
        id="export-vllm-over-its-input",
    ),
    row(
        "export s.json --format kvpress --out s.py",
        "--out s.py's sidecar s.json is the strategy file",
        S,
        id="export-sidecar-over-its-input",
    ),
]


@pytest.mark.parametrize("argv,match,files", CASES)
def test_bad_input_is_refused_before_any_work(argv, match, files, tmp_path, monkeypatch, capsys):
    run_case(argv, match, files, tmp_path, monkeypatch, capsys)


def test_the_largest_layer_count_is_solved(tmp_path, monkeypatch, capsys):
    """The cap refuses nothing real: 10,000 layers are solved and written."""
    import json

    from polykv_search.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(SOLVE.split() + ["--num-layers", "10000"]) == 0
    assert len(json.loads((tmp_path / "o.json").read_text())["layers"]) == 10_000


def test_every_option_of_every_command_says_what_it_does():
    from polykv_search.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    silent = {
        name: [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
        for name, parser in commands.choices.items()
    }
    assert not {name: flags for name, flags in silent.items() if flags}
