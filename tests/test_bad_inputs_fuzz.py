"""Malformed strategy documents, signal tables and results, generated: refused in one line, never a traceback."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from polykv_search.cli import main
from strategies import PHASES, Strategy, StrategyError
from tests.bad_inputs_support import (
    LATIN1,
    L,
    ModelLoaded,
    deadline,
    make,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    partial_row,
    results_doc,
    signals_doc,
    strategy_doc,
)

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


# --------------------------------------------------------------------------------------------
# Random bytes and random JSON as any input file of any command: never a hang, never a traceback

#: slot -> (command line, where the file goes, whether a file that passes every check reaches the model)
SLOTS = {
    "show": ("show f.json", "f.json", False),
    "export": ("export f.json --format json --out o.json", "f.json", False),
    "compare": ("compare f.json", "f.json", False),
    "compare-signals": ("compare r.json --signals f.json --objective dppl", "f.json", False),
    "solve-signals": ("solve --budget 64 --signals f.json --method uniform --out o.json", "f.json", False),
    "solve-optuna-signals": (
        "solve --budget 64 --signals f.json --method optuna --storage memory --out o.json",
        "f.json",
        True,
    ),
    "score-strategy": ("score --strategy f.json --suite ruler --out o.json", "f.json", True),
    "score-partial": ("score --baseline full --out o.json", "o.json.partial", True),
    "generate-strategy": ("generate --strategy f.json", "f.json", True),
    "generate-prompt": ("generate --prompt-file f.txt", "f.txt", True),
    "collect-calib-txt": ("collect --calib c.txt --out o.json", "c.txt", True),
    "collect-calib-jsonl": ("collect --calib c.jsonl --out o.json", "c.jsonl", True),
}


def _partial_doc() -> dict:
    """A score checkpoint as one JSON document (``read_partial`` reads it as lines: see ``_partial_lines``)."""
    return {"head": {"key": "0123456789abcdef01234567"}, "row": partial_row()}


def _partial_lines(doc) -> str:
    if isinstance(doc, dict) and set(doc) == {"head", "row"}:
        return json.dumps(doc["head"]) + "\n" + json.dumps(doc["row"]) + "\n"
    return json.dumps(doc)


file_contents = st.one_of(
    st.binary(max_size=300),
    json_values.map(json.dumps),
    mutated(strategy_doc),
    mutated(signals_doc),
    mutated(results_doc),
    mutated(_partial_doc).map(lambda text: _partial_lines(json.loads(text))),
    st.text(max_size=200),
)


def _reader(slot: str):
    """The library reader of the file in ``slot`` (raises on a file the command must refuse)."""
    from polykv_search.data import load_corpus
    from polykv_search.scoring import resolve_tasks
    from polykv_search.scoring.checkpoint_schema import read_partial
    from signals import SignalTable

    if slot == "score-partial":
        kinds = {t.name: t.kind for t in resolve_tasks("broad,ruler")}
        return lambda path: read_partial(path, entries=1, kinds=kinds)
    if slot in ("score-strategy", "generate-strategy"):
        return Strategy.load
    if slot == "solve-optuna-signals":
        return SignalTable.load
    if slot.startswith("collect-calib"):
        return lambda path: load_corpus(str(path))
    return lambda path: path.read_text(encoding="utf-8")  # a prompt: any UTF-8 text


def _run_slot(slot: str, data, tmp_path_factory) -> None:
    import contextlib
    import io
    import shlex

    argv, where, may_load = SLOTS[slot]
    folder = tmp_path_factory.mktemp("slot")
    make("results", folder / "r.json")
    (folder / where).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    err = io.StringIO()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with deadline(30), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(shlex.split(argv))
    except ModelLoaded:  # only a file its own reader accepts may get as far as the model
        assert may_load, f"{slot}: the file reached the model load"
        _reader(slot)(folder / where)
        return
    finally:
        os.chdir(cwd)
    text = err.getvalue()
    assert "Traceback" not in text
    assert rc == 0 or (rc == 2 and text.startswith("error: ") and text.count("\n") == 1), (slot, text)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(slot=st.sampled_from(sorted(SLOTS)), data=file_contents)
def test_any_bytes_as_any_input_file_are_handled_or_refused_in_one_line(slot, data, tmp_path_factory):
    _run_slot(slot, data, tmp_path_factory)


@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_every_slot_refuses_garbage_and_accepts_nothing_silently(slot, tmp_path_factory):
    """The fixed corner cases of each slot: latin-1, a NUL, an empty file, JSON of the wrong shape."""
    for data in (LATIN1, b"\x00\xff\xfe", b"", b"[]", b"null", b'{"schema": "polykv-signals"}', b"\n\n\n"):
        _run_slot(slot, data, tmp_path_factory)


@settings(max_examples=100, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=file_contents)
def test_library_readers_raise_their_own_error_types_only(data, tmp_path_factory):
    """The score checkpoint reader and the lm-eval argument check, on the same random files."""
    from polykv_search.integrations.lm_eval_support import check_model_args
    from polykv_search.scoring import ScoreError
    from polykv_search.scoring.checkpoint_schema import read_partial

    path = tmp_path_factory.mktemp("lib") / "f.json"
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    with deadline(30):
        try:
            read_partial(path, entries=1, kinds={"ruler/niah_single": "generate"})
        except ScoreError as err:
            assert "\n" not in str(err) and str(path) in str(err)
        try:
            check_model_args({"strategy": str(path)})
        except StrategyError as err:
            assert str(path) in str(err)
