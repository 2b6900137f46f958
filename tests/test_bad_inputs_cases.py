"""Every bad input, for every command: one line on stderr, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import shlex

import pytest

from polykv_search.cli import main
from tests.bad_inputs_support import (
    READ_ONLY,
    RES,
    SIG,
    S,
    make,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    ro,
    row,
    snapshot,
    time_limit,  # noqa: F401  (autouse: a hang fails the test)
)

# One row per case. Each row names the command line (``{tmp}`` is the test's folder, also the working
# directory), the files to generate first, and a fragment of the one line the user must see. The
# runner asserts exit code 2, exactly one line on stderr starting with ``error:``, no traceback, the
# fragment, and that the folder is byte-for-byte as it was: no output file, no half-written file, no
# stray ``.tmp``.
CASES = [
    # ---- top level
    row("", "choose a command", id="no-command"),
    row("nosuch", "invalid choice: 'nosuch'", id="unknown-command"),
    row(
        "show s.json --bogus",
        "show: unrecognized arguments: --bogus (see `polykv-search show --help`)",
        S,
        id="unknown-flag",
    ),
    # ---- show
    row("show missing.json", "cannot read missing.json", id="show-missing-file"),
    row("show bad.json", "bad.json: not UTF-8 text", {"bad.json": "latin1"}, id="show-not-utf8"),
    row("show bad.json", "bad.json: not a JSON object", {"bad.json": "not-json"}, id="show-not-json"),
    row("show bad.json", "bad.json: not a JSON object", {"bad.json": "json-array"}, id="show-json-array"),
    row("show bad.json", "unknown schema 'something-else'", {"bad.json": "unknown-schema"}, id="show-unknown-schema"),
    row("show bad.json", "bad.json: not a JSON object", {"bad.json": "truncated-strategy"}, id="show-truncated"),
    row(
        "show bad.json",
        "global_budget: nan is not a finite number",
        {"bad.json": "strategy-nan-budget"},
        id="show-nan-budget",
    ),
    row(
        "show bad.json", "layers[1].prefill.params.window: inf", {"bad.json": "strategy-inf-param"}, id="show-inf-param"
    ),
    row("show bad.json", "provenance.score: nan", {"bad.json": "strategy-nan-provenance"}, id="show-nan-provenance"),
    row("show s.json --plot p.png", "--plot draws signal tables; s.json is a strategy", S, id="show-plot-of-strategy"),
    row("show sig.json --plot d", "--plot d: is a directory", {**SIG, "d": "dir"}, id="show-plot-is-dir"),
    row("show sig.json --plot f/p.png", "f is not a directory", {**SIG, "f": "prose"}, id="show-plot-under-file"),
    row("show bad.json", "nan", {"bad.json": "signals-nan-cell"}, id="show-signals-nan-cell"),
    # ---- export
    row("export bad.json --format json --out o.json", "not UTF-8 text", {"bad.json": "latin1"}, id="export-not-utf8"),
    row("export s.json --format json --out d", "--out d: is a directory", {**S, "d": "dir"}, id="export-out-is-dir"),
    row(
        "export s.json --format json --out f/o.json",
        "f is not a directory",
        {**S, "f": "prose"},
        id="export-out-under-file",
    ),
    row(
        f"export s.json --format json --out {READ_ONLY}",
        "cannot write in /proc",
        S,
        id="export-out-read-only",
        marks=ro,
    ),
    row(
        "export s.json --format kvpress --out press.py",
        "--out press.py's sidecar press.json: is a directory",
        {**S, "press.json": "dir"},
        id="export-kvpress-sidecar-is-dir",
    ),
    row("export s.json --format onnx --out o.json", "invalid choice: 'onnx'", S, id="export-unknown-format"),
    row(
        "export s.json --format trtllm --out t.yaml --max-seq-len 0",
        "expected a positive integer",
        S,
        id="export-max-seq-len-0",
    ),
    row(
        "export bad.json --format json --out o.json",
        "layers[1].prefill.params.window: inf",
        {"bad.json": "strategy-inf-param"},
        id="export-inf-param",
    ),
    # ---- generate
    row("generate --temperature nan", "expected a finite number >= 0, got 'nan'", id="generate-temperature-nan"),
    row("generate --temperature -1", "expected a finite number >= 0, got '-1'", id="generate-temperature-negative"),
    row("generate --temperature inf", "expected a finite number >= 0, got 'inf'", id="generate-temperature-inf"),
    row("generate --seed 3", "--seed applies to sampling", id="generate-seed-without-sampling"),
    row(
        "generate --decode-interval 2",
        "--decode-interval applies with --strategy",
        id="generate-interval-without-strategy",
    ),
    row("generate --max-new-tokens 0", "expected a positive integer", id="generate-max-new-tokens-0"),
    row(
        "generate --prompt-file p.txt",
        "--prompt-file p.txt: not UTF-8 text",
        {"p.txt": "latin1"},
        id="generate-prompt-not-utf8",
    ),
    row("generate --prompt-file nope.txt", "cannot read --prompt-file nope.txt", id="generate-prompt-missing"),
    row("generate --prompt-file p.txt", "the prompt is empty", {"p.txt": "empty"}, id="generate-prompt-empty-file"),
    row("generate --prompt ''", "the prompt is empty", id="generate-prompt-empty"),
    row("generate --strategy bad.json", "not UTF-8 text", {"bad.json": "latin1"}, id="generate-strategy-not-utf8"),
    row("generate --model ./no/such/model", "does not exist", id="generate-model-path-missing"),
    row("generate --model some-org/no-such-model", "the hub is unreachable", id="generate-hub-unreachable"),
    row("generate --device tpu", "invalid device 'tpu'", id="generate-bad-device"),
    row("generate --dtype float8", "invalid choice: 'float8'", id="generate-bad-dtype"),
    # ---- collect
    row("collect --budgets 32,,64 --out o.json", "empty budget in '32,,64'", id="collect-empty-list-item"),
    row("collect --budgets 0,32 --out o.json", "expected a positive integer", id="collect-budget-0"),
    row("collect --budgets 32,abc --out o.json", "'abc' in '32,abc'", id="collect-budget-not-int"),
    row("collect --budgets , --out o.json", "expected a comma-separated list of budgets", id="collect-empty-list"),
    row("collect --patterns snapkv,nosuch --out o.json", "unknown pattern 'nosuch'", id="collect-unknown-pattern"),
    row("collect --phases prefill,bogus --out o.json", "phases", id="collect-unknown-phase"),
    row(
        "collect --context-len 1 --out o.json",
        "--context-len 1 must exceed the largest of --budgets",
        id="collect-context-too-short",
    ),
    row(
        "collect --continuation-len 1 --out o.json",
        "--continuation-len must be at least 2",
        id="collect-continuation-1",
    ),
    row("collect --samples 0 --out o.json", "expected a positive integer", id="collect-samples-0"),
    row("collect --seed -1 --out o.json", "expected a non-negative integer", id="collect-seed-negative"),
    row("collect --layers 3-1 --out o.json", "empty layer range '3-1'", id="collect-layers-backwards"),
    row(
        "collect --layers 0,,2 --out o.json", "expected 'all' or layers like 0,5,10-12", id="collect-layers-empty-item"
    ),
    row("collect --out d", "--out d: is a directory", {"d": "dir"}, id="collect-out-is-dir"),
    row("collect --out f/o.json", "f is not a directory", {"f": "prose"}, id="collect-out-under-file"),
    row(f"collect --out {READ_ONLY}", "cannot write in /proc", id="collect-out-read-only", marks=ro),
    row("collect --resume --fresh --out o.json", "contradict", id="collect-resume-and-fresh"),
    row("collect --resume --out o.json", "nothing to resume", id="collect-resume-without-journal"),
    row(
        "collect --address tcp://h:1 --out o.json",
        "--address applies to --backend dask or ray",
        id="collect-address-without-backend",
    ),
    row("collect --backend loky --out o.json", "give --jobs 2 or more", id="collect-loky-one-job"),
    row("collect --calib nope.txt --out o.json", "no such corpus file", id="collect-calib-missing"),
    row(
        "collect --calib c.txt --out o.json", "c.txt: not UTF-8 text", {"c.txt": "latin1"}, id="collect-calib-not-utf8"
    ),
    row(
        "collect --calib c.csv --out o.json",
        "unsupported corpus file type .csv",
        {"c.csv": "prose"},
        id="collect-calib-csv",
    ),
    # ---- solve
    row("solve --method nosuch", "unknown solver 'nosuch'", id="solve-unknown-method-first"),
    row(
        "solve --budget 0 --num-layers 4 --method uniform --out o.json",
        "expected a finite number >= 1, got '0'",
        id="solve-budget-0",
    ),
    row("solve --budget nan --num-layers 4 --method uniform --out o.json", "got 'nan'", id="solve-budget-nan"),
    row("solve --budget inf --num-layers 4 --method uniform --out o.json", "got 'inf'", id="solve-budget-inf"),
    row(
        "solve --budget 64 --num-layers 4 --method uniform --out d",
        "is a directory",
        {"d": "dir"},
        id="solve-out-is-dir",
    ),
    row(
        "solve --budget 64 --num-layers 4 --method uniform --out f/o.json",
        "f",
        {"f": "prose"},
        id="solve-out-under-file",
    ),
    row(
        "solve --budget 64 --signals bad.json --out o.json",
        "UTF-8",
        {"bad.json": "latin1"},
        id="solve-signals-not-utf8",
    ),
    row(
        "solve --budget 64 --signals bad.json --out o.json",
        "nan",
        {"bad.json": "signals-nan-cell"},
        id="solve-signals-nan-cell",
    ),
    row(
        "solve --budget 64 --signals sig.json --grid 32,,64 --method ilp --out o.json",
        "empty budget",
        SIG,
        id="solve-grid-empty-item",
    ),
    # ---- score
    row("score --suite nosuch --baseline full --out o.json", "nosuch", id="score-unknown-suite"),
    row("score --baseline full --budget nan --out o.json", "got 'nan'", id="score-budget-nan"),
    row(
        "score --strategy bad.json --out o.json", "not UTF-8 text", {"bad.json": "latin1"}, id="score-strategy-not-utf8"
    ),
    row("score --baseline bogus --out o.json", "bogus", id="score-unknown-baseline"),
    row("score --baseline uniform:snapkv --out o.json", "--budget", id="score-uniform-without-budget"),
    row("score --baseline full --out d", "is a directory", {"d": "dir"}, id="score-out-is-dir"),
    # ---- compare
    row("compare missing.json", "cannot read missing.json", id="compare-missing-file"),
    row("compare bad.json", "not", {"bad.json": "latin1"}, id="compare-not-utf8"),
    row("compare bad.json", "not valid JSON", {"bad.json": "not-json"}, id="compare-not-json"),
    row("compare bad.json --json o.json", "ruler", {"bad.json": "results-string-score"}, id="compare-string-score"),
    row("compare bad.json --json o.json", "nan", {"bad.json": "results-nan-score"}, id="compare-nan-score"),
    row("compare r.json --json d", "is a directory", {**RES, "d": "dir"}, id="compare-json-is-dir"),
    row("compare r.json --plot f/p.png", "f is not a directory", {**RES, "f": "prose"}, id="compare-plot-under-file"),
    # ---- quickstart
    row("quickstart --out f", "f", {"f": "prose"}, id="quickstart-out-is-file"),
    row("quickstart --budget 0", "expected a finite number >= 1", id="quickstart-budget-0"),
    row("quickstart --out q --suite nosuch", "nosuch", id="quickstart-unknown-suite"),
    row("quickstart --out q --budgets 32,,64", "empty budget", id="quickstart-empty-list-item"),
    row("quickstart --out q --methods nosuch", "nosuch", id="quickstart-unknown-method"),
    row("quickstart --out q --calib-samples 1", "needs --calib-samples of at least 2", id="qs-head-1-sample"),
    row("quickstart --out q --head-cells 32,512", "--head-cells: budgets must be below", id="quickstart-head-cell-ctx"),
    row("quickstart --out q --head-patterns tova", "'tova' has no head cells", id="quickstart-head-pattern"),
]


@pytest.mark.parametrize("argv,match,files", CASES)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(argv, match, files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, kind in files.items():
        make(kind, tmp_path / name)
    before = snapshot(tmp_path)
    rc = main(shlex.split(argv.format(tmp=tmp_path)))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert match.lower() in err.lower(), err
    assert snapshot(tmp_path) == before  # no output, no half-written file, no stray .tmp


def test_the_corpus_covers_every_command():
    from polykv_search.cli import COMMANDS

    ids = [c.id for c in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    assert {i.split("-")[0] for i in ids} >= set(COMMANDS)


# --------------------------------------------------------------------------------------------
# The generated files are good apart from the one defect: their clean versions are accepted


@pytest.mark.parametrize(
    "argv,files",
    [
        ("show s.json", S),
        ("show sig.json", SIG),
        ("export s.json --format json --out o.json", S),
        ("compare r.json --json o.json", RES),
        ("solve --budget 64 --num-layers 4 --method uniform --out o.json", {}),
    ],
    ids=["show-strategy", "show-signals", "export", "compare", "solve"],
)
def test_clean_inputs_are_accepted(argv, files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, kind in files.items():
        make(kind, tmp_path / name)
    assert main(shlex.split(argv)) == 0, capsys.readouterr().err
