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
BARE, M = "--model ./m", {"m/config.json": "model-config-bare"}

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
    row(f"{OPTUNA} --jobs 1000000000", "jobs: expected at most 64, got 1,000,000,000", SIG, id="optuna-jobs"),
    row(f"{OPTUNA} --population 1000000000", "population: expected at most 10,000", SIG, id="optuna-population"),
    row(f"{OPTUNA} --startup-trials 10001", "startup_trials: expected at most 10,000", SIG, id="optuna-startup"),
    row(f"{OPTUNA} --context-len 1000000000", "context_len: expected at most 1,048,576", SIG, id="optuna-context-1e9"),
    row(
        f"{OPTUNA} --model smollm2-135m --context-len 9000",
        "--context-len 9000 + 64 tokens decoded or teacher-forced after it = 9064 positions, over the 8192 of",
        SIG,
        id="optuna-context-over-the-model-window",
    ),
    row(f"{SEARCH} --neighbors 1000000000", "neighbors: expected at most 10,000", SIG, id="search-neighbors"),
    row(f"{SEARCH} --max-moves 1000000000", "max_moves: expected at most 10,000", SIG, id="search-max-moves"),
    row(f"{SEARCH} --batch-entries 1000000000", "batch_entries: expected at most 1,024", SIG, id="search-batch"),
    row(f"{POOL} --batch-entries 1025", "batch_entries: expected at most 1,024, got 1,025", SIG, id="pool-prior-batch"),
    row(
        "solve --method dp --signals sig.json --budget 64 --max-subsets 1000000000 --out o.json",
        "max_subsets: expected at most 1,000,000",
        SIG,
        id="dp-max-subsets",
    ),
    row(
        "solve --method ilp --granularity head --signals h.json --budget 64 --target-context-len 1000000000 "
        "--out o.json",
        "target_context_len: expected at most 1,048,576",
        {"h.json": "signals-heads"},
        id="ilp-target-context-len",
    ),
    # ---- lengths of a model whose config states no window: the stated ceiling (2**20 tokens)
    row(f"collect {BARE} --context-len 1000000000 --out o.json", "at most 1,048,576 tokens", M, id="collect-ctx-bare"),
    row(f"collect {BARE} --continuation-len 1048577 --out o.json", "at most 1,048,576 tokens", M, id="collect-cont"),
    row("collect --samples 1000000000 --out o.json", "at most 10,000 samples", id="collect-samples-1e9"),
    row(f"score {BARE} --baseline full --context-len 1048577 --out o.json", "at most 1,048,576 tokens", M, id="ctx"),
    row(f"score {BARE} --baseline full --max-new-tokens 1000000000 --out o.json", "1,048,576 tokens", M, id="new"),
    row(f"score {BARE} --suite decode --generate-len 1000000000 --out o.json", "1,048,576 tokens", M, id="gen-len"),
    row(
        "score --baseline full --suite broad/continuation --context-len 8150 --out o.json",
        "--context-len 8150 + 64 tokens decoded or teacher-forced after it = 8214 positions, over the 8192",
        id="score-continuation-counts-in-the-window",
    ),
    row("score --baseline full --batch-entries 1000000000 --out o.json", "at most 1,024", id="score-batch-entries"),
    row("score --baseline full --decode-batch 1000000000 --out o.json", "at most 1,024", id="score-decode-batch"),
    row(f"generate {BARE} --prompt hi --max-new-tokens 1000000000", "at most 1,048,576 tokens", M, id="generate-new"),
    row("quickstart --context-len 1000000000 --out q", "at most 1,048,576 tokens", id="quickstart-context-1e9"),
    row("quickstart --calib-samples 1000000000 --out q", "at most 10,000 samples", id="quickstart-calib-samples"),
    row(
        "quickstart --eval-context-len 9000 --out q",
        "--eval-context-len 9000 + 120 tokens decoded or teacher-forced after it = 9120 positions, over the 8192",
        id="quickstart-eval-context-over-the-model-window",
    ),
    # ---- seeds past what the generators take (torch: 2**64 - 1, numpy's legacy seeding: 2**32 - 1)
    row("score --baseline full --seed 18446744073709551616 --out o.json", "at most 4,294,967,295", id="score-seed"),
    row("generate --prompt hi --temperature 1 --seed 18446744073709551616", "at most 4,294,967,295", id="gen-seed"),
    row(f"{OPTUNA} --seed -1", "seed: a seed must be >= 0, got -1", SIG, id="optuna-seed-negative"),
    row(f"{SEARCH} --sample-seed 4294967296", "sample_seed: expected at most 4,294,967,295", SIG, id="search-seed"),
    row(f"{POOL} --seed -1", "seed: a seed must be >= 0, got -1", SIG, id="pool-prior-seed-negative"),
    row(f"{GUARD} 8 --guard-seed -1", "expected a non-negative integer, got -1", SIG, id="guard-seed-negative"),
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
    + [("optuna", "trials", 10_000), ("optuna", "samples", 10_000), ("optuna", "jobs", 64)]
    + [("optuna", "population", 10_000), ("optuna", "startup_trials", 10_000), ("optuna", "context_len", 2**20)]
    + [("search", "neighbors", 10_000), ("search", "max_moves", 10_000), ("search", "batch_entries", 1_024)]
    + [("pool-prior", "batch_entries", 1_024), ("dp", "max_subsets", 1_000_000)]
    + [(method, "target_context_len", 2**20) for method in ("ilp", "dp", "duo", "headkv")],
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
