"""Malformed strategy documents, signal tables and results, generated: refused in one line, never a traceback."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from polykv_search.cli import main
from strategies import PHASES, Strategy, StrategyError
from tests.bad_inputs_support import (
    L,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
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
