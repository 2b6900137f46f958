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
SEARCH = "solve --method search --signals sig.json --budget 64 --out o.json"
POOL = "solve --method pool-prior --signals sig.json --budget 64 --out o.json"
OPTUNA = "solve --method optuna --signals sig.json --budget 64 --out o.json"
GUARD = "solve --method ilp --signals sig.json --budget 64 --out o.json --guard"

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
    # ---- solvers that run the model: samples generated before the first run, strategies each run on all of them
    row(f"{SEARCH} --samples 1000000000", "expected at most 1,000, got 1,000,000,000", SIG, id="search-samples"),
    row(f"{SEARCH} --samples 1001", "samples: expected at most 1,000, got 1,001", SIG, id="search-samples-1001"),
    row(f"{SEARCH} --max-evaluations 10001", "max_evaluations: expected at most 10,000", SIG, id="search-evaluations"),
    row(f"{SEARCH} --max-evaluations 0", "max_evaluations: must be at least 1", SIG, id="search-evaluations-0"),
    row(f"{POOL} --samples 100000", "samples: expected at most 1,000, got 100,000", SIG, id="pool-prior-samples"),
    row(f"{OPTUNA} --trials 100000000", "trials: expected at most 10,000, got 100,000,000", SIG, id="optuna-trials"),
    row(f"{OPTUNA} --samples 10001", "samples: expected at most 10,000, got 10,001", SIG, id="optuna-samples"),
    row(f"{GUARD} 1000000", "expected at most 1,000 guard samples, got 1,000,000", SIG, id="guard-1e6"),
    row(f"{GUARD} 1001", "expected at most 1,000 guard samples, got 1,001", SIG, id="guard-over-the-cap"),
    row(f"{GUARD} -1", "expected a non-negative integer, got -1", SIG, id="guard-negative"),
    # ---- score --samples (quickstart --eval-samples): generated and held before the first is scored
    row("score --baseline full --samples 100000000000 --out o.json", "at most 10,000 samples", id="score-samples-1e11"),
    row("quickstart --eval-samples 10001 --out q", "at most 10,000 samples per task", id="quickstart-eval-samples"),
    row("quickstart --optuna-trials 10001 --out q", "at most 10,000 trials, got 10,001", id="quickstart-optuna-trials"),
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


@pytest.mark.parametrize(
    "method, name, most",
    [("search", "samples", 1_000), ("search", "max_evaluations", 10_000), ("pool-prior", "samples", 1_000)]
    + [("optuna", "trials", 10_000), ("optuna", "samples", 10_000)],
)
def test_solver_counts_take_their_cap_and_refuse_one_more(method, name, most):
    from solvers import SolverError, get_solver_class

    settings = get_solver_class(method).Settings
    assert getattr(settings.from_strings({name: str(most)}), name) == most
    with pytest.raises(SolverError, match=f"{name}: expected at most {most:,}, got {most + 1:,}"):
        settings.from_strings({name: str(most + 1)})
    assert {i.name: i.most for i in settings.fields_info()}[name] == most


def test_the_guard_takes_1000_samples_at_most_from_the_api_too():
    from signals import random_signal_table
    from solvers import Problem, SolverError
    from solvers.guard import run_guard

    p = Problem(global_budget=32, table=random_signal_table(4, seed=0), b_min=8)
    with pytest.raises(SolverError, match="guard: needs at least 2 samples and at most 1,000, got 1,001"):
        run_guard(None, None, p, "ilp", None, 1001)


def test_every_option_of_every_command_says_what_it_does():
    from polykv_search.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    silent = {
        name: [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
        for name, parser in commands.choices.items()
    }
    assert not {name: flags for name, flags in silent.items() if flags}
