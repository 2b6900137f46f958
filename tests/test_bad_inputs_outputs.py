"""Outputs and inputs a demanding user gets wrong, refused as the corpus of ``test_bad_inputs_cases.py`` is (exit
code 2, one ``error:`` line, nothing written or changed, no model loaded): an output that names the command's own
input (``solve --signals t.json --out t.json`` replaced the table with a strategy), an empty output path (taken
for "no output", or for the working directory by ``quickstart``), a file path ending in a slash (written as the
file without it), and what was refused only after the model loaded: a ``score --corpus`` that cannot be read,
``collect --layers`` past the model's, ``score`` entries that share a name or a strategy of another layer count."""

from __future__ import annotations

import pytest

from tests.bad_inputs_support import (
    HUGE_CONFIG,
    RES,
    SIG,
    S,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    row,
    run_case,
    time_limit,  # noqa: F401  (autouse: a hang fails the test)
)

REPLACE = "writing it would replace that input, give another name"
HUGE = {"m/config.json": "model-config-huge"}

CASES = [
    # ---- an output that is one of the command's inputs
    row(
        "solve --budget 64 --signals sig.json --out sig.json",
        f"--out sig.json is the --signals table; {REPLACE}",
        SIG,
        id="solve-out-is-signals",
    ),
    row(
        "solve --budget 64 --signals sig.json --out d/../sig.json",
        "is the --signals table",
        {**SIG, "d": "dir"},
        id="solve-out-is-signals-other-spelling",
    ),
    row(
        "score --strategy s.json --out s.json",
        f"--out s.json is a --strategy file; {REPLACE}",
        S,
        id="score-out-is-strategy",
    ),
    row(
        "compare r.json --json r.json",
        f"--json r.json is a results file it compares; {REPLACE}",
        RES,
        id="compare-json-is-results",
    ),
    row(
        "compare r.json --plot r.json", "--plot r.json is a results file it compares", RES, id="compare-plot-is-results"
    ),
    row(
        "compare r.json --signals sig.json --json sig.json",
        "--json sig.json is the --signals table",
        {**RES, **SIG},
        id="compare-json-is-signals",
    ),
    row(
        "show sig.json --plot sig.json",
        f"--plot sig.json is the table it shows; {REPLACE}",
        SIG,
        id="show-plot-is-table",
    ),
    row(
        "collect --calib c.txt --out c.txt",
        "--out c.txt is the --calib corpus",
        {"c.txt": "prose"},
        id="collect-out-is-calib",
    ),
    # ---- an empty output path is refused, not taken for "no output" or for the working directory
    row("show sig.json --plot ''", "--plot: empty path", SIG, id="show-plot-empty"),
    row("compare r.json --json ''", "--json: empty path", RES, id="compare-json-empty"),
    row("compare r.json --plot ''", "--plot: empty path", RES, id="compare-plot-empty"),
    row("quickstart --out ''", "--out: empty path", id="quickstart-out-empty"),
    # ---- a file name ending in a slash names a folder
    row(
        "export s.json --format json --out o.json/",
        "--out o.json/: ends in a slash, as a folder does",
        S,
        id="export-out-slash",
    ),
    row("solve --budget 64 --num-layers 4 --method uniform --out new/", "ends in a slash", {}, id="solve-out-slash"),
    # ---- inputs read only after the model loaded
    row(
        "score --baseline full --corpus nosuch.txt --out o.json",
        "no such corpus file or directory: nosuch.txt",
        id="score-corpus-missing",
    ),
    row(
        "score --baseline full --corpus c.json --out o.json",
        "unsupported corpus file type .json",
        {"c.json": "empty"},
        id="score-corpus-type",
    ),
    row(
        "collect --model ./m --layers 3,100 --out o.json",
        "--layers: [100] out of range [0, 100)",
        HUGE,
        id="collect-layers-past-model",
    ),
    row(
        "score --strategy a/s.json --strategy b/s.json --out o.json",
        "duplicate entry names: ['s']",
        {"a/s.json": "strategy", "b/s.json": "strategy"},
        id="score-two-files-one-stem",
    ),
    row(
        "score --strategy full.json --baseline full --out o.json",
        "duplicate entry names: ['full']",
        {"full.json": "strategy"},
        id="score-file-named-as-a-baseline",
    ),
    row(
        "score --strategy s.json --model ./m --out o.json",
        "s.json: layers: strategy has 4 layers but the model has 100",
        {**S, **HUGE},
        id="score-strategy-layers-not-the-models",
    ),
    row(
        "generate --strategy s.json --model ./m",
        "s.json: layers: strategy has 4 layers but the model has 100",
        {**S, **HUGE},
        id="generate-strategy-layers-not-the-models",
    ),
]


@pytest.mark.parametrize("argv,match,files", CASES)
def test_bad_input_is_refused_up_front(argv, match, files, tmp_path, monkeypatch, capsys):
    run_case(argv, match, files, tmp_path, monkeypatch, capsys)


def test_the_huge_config_has_the_layer_count_the_layers_row_assumes():
    assert HUGE_CONFIG["num_hidden_layers"] == 100


@pytest.mark.parametrize(
    "argv,files",
    [
        ("solve --budget 64 --signals sig.json --out o.json", SIG),
        ("compare r.json --json c.json --plot c.png", RES),
        ("export s.json --format json --out s.json", S),  # canonical JSON in place: the strategy is kept
    ],
    ids=["solve", "compare", "export-in-place"],
)
def test_outputs_beside_their_inputs_are_still_written(argv, files, tmp_path, monkeypatch, capsys):
    import shlex

    from polykv_search.cli import main
    from tests.bad_inputs_support import make

    monkeypatch.chdir(tmp_path)
    for name, kind in files.items():
        make(kind, tmp_path / name)
    assert main(shlex.split(argv)) == 0, capsys.readouterr().err


def test_score_scores_every_strategy_flag_not_only_the_last():
    from polykv_search.cli import build_parser

    args = build_parser().parse_args(["score", "--strategy", "a.json", "--strategy", "b.json", "c.json", "--out", "o"])
    assert args.strategy == ["a.json", "b.json", "c.json"]
    assert build_parser().parse_args(["score", "--baseline", "full", "--out", "o"]).strategy == []
