"""Every bad input, for every command: one line on stderr, exit code 2, no traceback, nothing written.

One row per case. Each row names the command line (``{tmp}`` is the test's folder, also the working
directory), the files to generate first, and a fragment of the one line the user must see. The
runner asserts exit code 2, exactly one line on stderr starting with ``error:``, no traceback, the
fragment, and that the folder is byte-for-byte as it was: no output file, no half-written file, no
stray ``.tmp``. Nothing here may load a model: bad input is refused before one is loaded, and a
case that reaches the loader fails with :class:`ModelLoaded`.

Rows that wait for a change in a module this file does not own are strict xfails naming the change.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from polykv_search.cli import main
from strategies import PHASES, Strategy, StrategyError

L = 4


class ModelLoaded(BaseException):
    """Raised where a model would be loaded: bad input must be refused before that."""


@pytest.fixture(autouse=True)
def no_model_no_network(monkeypatch):
    import huggingface_hub
    import transformers

    def loading(*args, **kwargs):
        raise ModelLoaded("bad input reached model loading")

    def no_network(self, repo_id, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(auto, "from_pretrained", loading)
    monkeypatch.setattr("polykv_search.models._gguf_checkpoint", loading)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_network)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)


# --------------------------------------------------------------------------------------------
# Generated input files


def strategy_doc() -> dict:
    prefill = [("streaming_llm", 96), ("snapkv", 80), ("h2o", 48), ("tova", 32)]
    return Strategy.from_choices(prefill, [("tova", 64)] * L, 64.0, solver="test").to_json()


def signals_doc() -> dict:
    from signals.synthetic import random_signal_table

    return random_signal_table(num_layers=L, patterns=("snapkv", "tova"), budgets=(32, 64), seed=1).to_json()


def results_doc() -> dict:
    tasks = {"ruler/niah_single": "aaaa", "broad/continuation": "bbbb"}

    def entry(name: str, strategy: Strategy, kind: str, suites: dict[str, float]) -> dict:
        ratio = 1.0 if strategy.is_full else 0.125
        return {
            "name": name, "kind": kind, "source": name, "strategy_digest": strategy.digest(),
            "global_budget": strategy.global_budget, "solver": strategy.provenance.get("solver"),
            "strategy": strategy.to_json(), "scores": {t: suites[t.split("/")[0]] for t in tasks},
            "suites": suites, "extra": {}, "kv_bytes": 1e6 * ratio, "full_kv_bytes": 1e6, "kv_ratio": ratio,
            "seconds": 1.0, "tasks": {},
        }  # fmt: skip

    entries = [
        entry("full", Strategy.full(L), "baseline", {"ruler": 80.0, "broad": 90.0}),
        entry("uniform-snapkv", Strategy.uniform(L, "snapkv", 64), "baseline", {"ruler": 40.0, "broad": 70.0}),
        entry("proportional", Strategy.from_json(strategy_doc()), "strategy", {"ruler": 65.0, "broad": 75.0}),
    ]
    return {
        "schema": "polykv-results",
        "version": 1,
        "provenance": {
            "model": "tiny",
            "model_fingerprint": "m1",
            "settings": {"budget": 64, "samples": 2, "context_len": 512, "seed": 0, "decode_interval": 1},
            "tasks": {t: {"version": "1", "suite": t.split("/")[0], "samples": fp} for t, fp in tasks.items()},
        },
        "entries": entries,
    }


def _with(doc_fn, path: str, value) -> str:
    """The JSON of ``doc_fn()`` with the value at ``path`` (``a.0.b``) replaced; NaN written as NaN."""
    doc = doc_fn()
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return json.dumps(doc)


LATIN1 = "Caf\xe9 au lait, na\xefve r\xe9sum\xe9 \xe0 la carte".encode("latin-1")

FILES = {
    "strategy": lambda: json.dumps(strategy_doc()),
    "signals": lambda: json.dumps(signals_doc()),
    "results": lambda: json.dumps(results_doc()),
    "latin1": lambda: LATIN1,
    "not-json": lambda: "{this is not json",
    "json-array": lambda: "[1, 2, 3]",
    "unknown-schema": lambda: '{"schema": "something-else", "version": 1}',
    "truncated-strategy": lambda: json.dumps(strategy_doc())[:300],
    "strategy-nan-budget": lambda: _with(strategy_doc, "global_budget", math.nan),
    "strategy-inf-param": lambda: _with(strategy_doc, "layers.1.prefill.params", {"window": math.inf}),
    "strategy-nan-provenance": lambda: _with(strategy_doc, "provenance.score", math.nan),
    "signals-nan-cell": lambda: _with(signals_doc, "cosine.0.0.0.0", math.nan),
    "results-string-score": lambda: _with(results_doc, "entries.2.suites.ruler", "high"),
    "results-nan-score": lambda: _with(results_doc, "entries.2.suites.ruler", math.nan),
    "prose": lambda: "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 20,
    "empty": lambda: "",
}


def make(kind: str, path: Path) -> None:
    if kind == "dir":
        path.mkdir(parents=True)
        return
    data = FILES[kind]()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a hash of its bytes (``dir`` for folders)."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def needs(owner: str, what: str):
    return pytest.mark.xfail(strict=True, reason=f"needs {owner}: {what}")


def row(argv: str, match: str, files: dict[str, str] | None = None, *, id: str, marks=()):
    return pytest.param(argv, match, files or {}, id=id, marks=marks)


S, SIG, RES = {"s.json": "strategy"}, {"sig.json": "signals"}, {"r.json": "results"}
LINUX = sys.platform.startswith("linux")
READ_ONLY = "/proc/polykv-bad-input/out.json"  # /proc refuses new files, even to root
ro = pytest.mark.skipif(not LINUX, reason="needs /proc")

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
        "--out press.json: is a directory",
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
    row("collect --patterns snapkv,nosuch --out o.json", "unknown 'nosuch'", id="collect-unknown-pattern"),
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


# --------------------------------------------------------------------------------------------
# Errors that are bugs keep their traceback; Ctrl-C is one line and 130


def test_an_unexpected_exception_keeps_its_traceback(tmp_path, monkeypatch):
    import polykv_search.cli.show as show

    def bug(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(show, "run", bug)
    make("strategy", tmp_path / "s.json")
    with pytest.raises(ZeroDivisionError):
        main(["show", str(tmp_path / "s.json")])


@pytest.mark.parametrize("where", ["start-up", "command"])
def test_ctrl_c_exits_130_with_one_line(where, tmp_path, monkeypatch, capsys):
    import polykv_search.cli as cli
    import polykv_search.cli.show as show

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupt) if where == "start-up" else monkeypatch.setattr(
        show, "run", interrupt
    )
    make("strategy", tmp_path / "s.json")
    assert main(["show", str(tmp_path / "s.json")]) == 130
    out, err = capsys.readouterr()
    assert err == "interrupted\n" and out == ""


def test_ctrl_c_says_where_the_finished_work_is_in_the_same_line(tmp_path, monkeypatch, capsys):
    import polykv_search.cli.show as show
    from polykv_search.cli.common import Interrupted

    def interrupt(args):
        raise Interrupted("finished cells are kept in o.json.journal; rerun the same command to continue")

    monkeypatch.setattr(show, "run", interrupt)
    make("strategy", tmp_path / "s.json")
    assert main(["show", str(tmp_path / "s.json")]) == 130
    assert (
        capsys.readouterr().err
        == "interrupted: finished cells are kept in o.json.journal; rerun the same command to continue\n"
    )


def test_a_command_run_by_another_raises_for_its_caller(tmp_path, capsys):
    """``invoke`` has no boundary: quickstart can name its step in the one line ``main`` prints."""
    from polykv_search.cli import UsageError, invoke, is_user_error
    from polykv_search.cli.common import CLIError

    with pytest.raises(CLIError, match="cannot read") as err:
        invoke(["show", str(tmp_path / "missing.json")])
    assert is_user_error(err.value)
    with pytest.raises(UsageError, match="empty budget") as err:
        invoke(["collect", "--budgets", "32,,64", "--out", str(tmp_path / "o.json")])
    assert is_user_error(err.value) and not is_user_error(ZeroDivisionError())
    assert capsys.readouterr().err == ""


#: runs ``python -m polykv_search`` after saying "ready" (Python's SIGINT handler is in place by then)
READY_THEN_CLI = (
    "import runpy, sys; sys.stderr.write('ready\\n'); sys.stderr.flush(); "
    "runpy.run_module('polykv_search', run_name='__main__')"
)


@pytest.mark.skipif(not LINUX, reason="POSIX signals")
@pytest.mark.parametrize("delay", [0.2, 4.0])
def test_ctrl_c_in_a_real_process_during_imports_or_work(delay, tmp_path):
    """SIGINT 0.2 s after start-up lands in the CLI's imports (seconds of torch, transformers, ...);
    at 4 s in the imports or in a blocked read (stdin never closes)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-c", READY_THEN_CLI, "generate", "--prompt-file", "/dev/stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.stderr.readline() == b"ready\n"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert err.decode() == "interrupted\n" and out == b""


def test_a_broken_pipe_on_plain_stdout_exits_141_silently(tmp_path, monkeypatch, capsys):
    import polykv_search.cli.show as show

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(show, "run", closed_pipe)
    make("strategy", tmp_path / "s.json")
    assert main(["show", str(tmp_path / "s.json")]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not LINUX, reason="POSIX pipes")
def test_a_reader_that_leaves_early_is_not_an_error_report(tmp_path):
    """``polykv-search show s.json | head -1``: stdout closes under the writer; no traceback, a non-zero exit
    (rich's console exits 1 on a broken pipe, plain ``sys.stdout`` writes exit 141 as a shell would)."""
    make("strategy", tmp_path / "s.json")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "polykv_search", "show", "s.json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path, env=env)  # fmt: skip
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (1, 141) and err == ""


# --------------------------------------------------------------------------------------------
# Malformed strategy documents, generated: always a StrategyError, never another exception

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELDS = ["schema", "version", "num_layers", "global_budget", "b_min", "layers", "provenance"]


@st.composite
def mutated_strategy(draw) -> str:
    doc = strategy_doc()
    mode = draw(st.sampled_from(["field", "layer", "choice", "truncate"]))
    if mode == "field":
        doc[draw(st.sampled_from(FIELDS))] = draw(json_values)
    elif mode == "layer":
        doc["layers"][draw(st.integers(0, L - 1))] = draw(json_values)
    elif mode == "choice":
        layer = doc["layers"][draw(st.integers(0, L - 1))]
        layer[draw(st.sampled_from(PHASES))][draw(st.sampled_from(["pattern", "budget", "params"]))] = draw(json_values)
    text = json.dumps(doc)
    if mode == "truncate":
        text = text[: draw(st.integers(0, len(text) - 1))]
    return text


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(mutated_strategy())
def test_malformed_strategy_documents_are_refused_as_strategy_errors(text):
    try:
        strategy = Strategy.loads(text)
    except StrategyError as err:
        assert "\n" not in str(err)
        return
    # a mutation that happens to be valid must round-trip exactly
    assert Strategy.loads(strategy.dumps()).digest() == strategy.digest()


# --------------------------------------------------------------------------------------------
# The helpers command modules call


def test_comma_lists_refuse_empty_and_repeated_items():
    import argparse

    from polykv_search.cli.common import comma_list, positive_int

    budgets = comma_list(positive_int, "budget")
    assert budgets(" 32, 64 ,128") == [32, 64, 128]
    for text, message in [("32,,64", "empty budget"), ("", "comma-separated list"), ("32,32", "repeated budget"),
                          ("32,-1", "'-1' in '32,-1': expected a positive integer")]:  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            budgets(text)


def test_number_types_refuse_nan_infinities_and_out_of_range_values():
    import argparse

    from polykv_search.cli.common import finite_float, non_negative_float, non_negative_int, positive_float

    assert (finite_float("-2.5"), non_negative_float("0"), positive_float("1"), non_negative_int("0")) == (
        -2.5,
        0.0,
        1.0,
        0,
    )
    for parse, text in [(finite_float, "nan"), (finite_float, "-inf"), (non_negative_float, "-0.1"),
                        (positive_float, "0.5"), (positive_float, "inf"), (non_negative_int, "-1"),
                        (non_negative_int, "1.5")]:  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_output_checks_create_nothing(tmp_path):
    from polykv_search.cli.common import CLIError, check_output_dir, check_output_path

    assert check_output_path(tmp_path / "new" / "deeper" / "o.json") == tmp_path / "new" / "deeper" / "o.json"
    assert check_output_dir(tmp_path / "folder") == tmp_path / "folder"
    assert list(tmp_path.iterdir()) == []  # the missing folders can be made, but were not
    (tmp_path / "file").write_text("x")
    with pytest.raises(CLIError, match="--out .*file: exists and is not a directory"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(CLIError, match="--json .*: is a directory"):
        check_output_path(tmp_path, "--json")


def test_read_json_names_the_file_and_refuses_nan(tmp_path):
    from polykv_search.cli.common import CLIError, read_json

    path = tmp_path / "r.json"
    path.write_text('{"score": NaN}')
    with pytest.raises(CLIError, match=r"--results .*r.json: NaN is not a valid JSON number"):
        read_json(path, "--results")
    path.write_text('{"score": 1.5}')
    assert read_json(path) == {"score": 1.5}


# --------------------------------------------------------------------------------------------
# Malformed signal tables and results, generated, through the CLI: exit 0 or one line and exit 2


@st.composite
def mutated(draw, make_doc) -> str:
    """``make_doc()`` with one value somewhere inside it (the first 3 items of each list) replaced."""
    doc = make_doc()
    paths: list[list] = []

    def walk(node, path):
        paths.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node[:3]) if isinstance(node, list) else ()
        for key, value in items:
            walk(value, [*path, key])

    walk(doc, [])
    *parents, last = draw(st.sampled_from(paths[1:]))
    node = doc
    for key in parents:
        node = node[key]
    node[last] = draw(json_values)
    return json.dumps(doc)


def _cli_on(tmp_path_factory, argv: list[str], text: str) -> tuple[int, str]:
    import contextlib
    import io

    path = tmp_path_factory.mktemp("doc") / "doc.json"
    path.write_text(text)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([*argv, str(path)])
    return rc, err.getvalue()


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(text=mutated(signals_doc))
def test_malformed_signal_tables_are_shown_or_refused_in_one_line(text, tmp_path_factory):
    rc, err = _cli_on(tmp_path_factory, ["show"], text)
    assert rc == 0 or (rc == 2 and err.startswith("error: ") and err.count("\n") == 1), err


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(text=mutated(results_doc))
def test_malformed_results_are_compared_or_refused_in_one_line(text, tmp_path_factory):
    rc, err = _cli_on(tmp_path_factory, ["compare"], text)
    assert rc == 0 or (rc == 2 and err.startswith("error: ") and err.count("\n") == 1), err
