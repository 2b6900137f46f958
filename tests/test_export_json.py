"""`--format json` and the JSON Schema that ships with the package.

Real strategies (builders, solvers, every pattern) validate against the schema; broken ones do not;
the schema's pattern names and parameter defaults stay in step with ``polykv_search.patterns``.
The schema tests need ``jsonschema`` and are skipped without it.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from polykv_search.patterns import PATTERNS
from strategies import LayerChoice, Strategy
from strategies.export_json import load_schema, schema_path
from strategies.exporters import render_export


def mixed() -> Strategy:
    return Strategy(
        [LayerChoice("snapkv", 40, {"window": 8}), LayerChoice("h2o", 24, {"recent_ratio": 0.25})],
        [LayerChoice("tova", 32), LayerChoice("streaming_llm", 32, {"n_sink": 2})],
        global_budget=32,
        b_min=16,
        provenance={"solver": "test"},
    )


GOLDEN_JSON = """{
  "schema": "polykv-strategy",
  "version": 1,
  "num_layers": 2,
  "global_budget": 32,
  "b_min": 16,
  "layers": [
    {
      "layer": 0,
      "prefill": {
        "pattern": "snapkv",
        "budget": 40,
        "params": {
          "window": 8
        }
      },
      "decoding": {
        "pattern": "tova",
        "budget": 32,
        "params": {}
      }
    },
    {
      "layer": 1,
      "prefill": {
        "pattern": "h2o",
        "budget": 24,
        "params": {
          "recent_ratio": 0.25
        }
      },
      "decoding": {
        "pattern": "streaming_llm",
        "budget": 32,
        "params": {
          "n_sink": 2
        }
      }
    }
  ],
  "provenance": {
    "solver": "test"
  }
}
"""


def test_json_export_writes_the_canonical_file(tmp_path):
    export = render_export(mixed(), "json", tmp_path / "s.json")
    assert export.files == {tmp_path / "s.json": GOLDEN_JSON}
    assert Strategy.loads(GOLDEN_JSON).to_json() == mixed().to_json()
    assert export.warnings == []


def test_schema_ships_inside_the_package():
    path = schema_path()
    assert path.is_file() and path.parent.name == "schema" and path.parent.parent.name == "strategies"
    assert load_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def real_strategies() -> list[Strategy]:
    from solvers import Problem, get_solver

    out = [mixed(), Strategy.full(30), Strategy.full(1, model="x")]
    for name, cls in PATTERNS.items():
        if name != "full":
            out.append(Strategy.uniform(4, name, 64))
            defaults = {f.name: f.default for f in dataclasses.fields(cls)}
            out.append(Strategy.uniform(3, name, 32, params=defaults))
    for method, settings in [
        ("uniform", {"pattern": "snapkv"}),
        ("pyramid", {}),
        ("uniform", {"pattern": "streaming_llm"}),
    ]:
        out.append(get_solver(method, **settings).solve(Problem(num_layers=30, global_budget=64)).strategy)
    out.append(
        Strategy(
            [LayerChoice("full", 100), LayerChoice("pyramidkv", 28, {"kernel": 3, "pooling": "avgpool"})],
            [LayerChoice("random", 64, {"seed": 7}), LayerChoice("knorm", 64)],
            global_budget=64,
            b_min=16,
        )
    )
    return out


def test_real_strategies_validate_against_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for strategy in real_strategies():
        data = json.loads(strategy.dumps())  # exactly what lands on disk
        errors = sorted(validator.iter_errors(data), key=str)
        assert not errors, f"{strategy.provenance}: {errors[0].message}"


BROKEN = [
    ("wrong schema name", lambda d: d.update(schema="other")),
    ("wrong version", lambda d: d.update(version=3)),
    ("missing layers", lambda d: d.pop("layers")),
    ("no layers", lambda d: d.update(layers=[])),
    ("unknown top-level key", lambda d: d.update(extra=1)),
    ("b_min zero", lambda d: d.update(b_min=0)),
    ("global budget below 1", lambda d: d.update(global_budget=0.5)),
    ("unknown pattern", lambda d: d["layers"][0]["prefill"].update(pattern="nope")),
    ("negative budget", lambda d: d["layers"][0]["prefill"].update(budget=-1)),
    ("fractional budget", lambda d: d["layers"][0]["prefill"].update(budget=20.5)),
    ("missing budget", lambda d: d["layers"][0]["prefill"].pop("budget")),
    ("null budget with a pattern", lambda d: d["layers"][0]["prefill"].update(budget=None)),
    (
        "null budget under a global budget",
        lambda d: d["layers"][0]["prefill"].update(pattern="full", params={}, budget=None),
    ),
    ("unknown choice key", lambda d: d["layers"][0]["decoding"].update(ratio=0.5)),
    ("unknown layer key", lambda d: d["layers"][0].update(note="x")),
    ("missing phase", lambda d: d["layers"][1].pop("decoding")),
    ("snapkv unknown param", lambda d: d["layers"][0]["prefill"]["params"].update(bogus=1)),
    ("snapkv even kernel", lambda d: d["layers"][0]["prefill"]["params"].update(kernel=4)),
    ("snapkv zero window", lambda d: d["layers"][0]["prefill"]["params"].update(window=0)),
    ("snapkv bad pooling", lambda d: d["layers"][0]["prefill"]["params"].update(pooling="minpool")),
    ("h2o ratio above 1", lambda d: d["layers"][1]["prefill"]["params"].update(recent_ratio=1.5)),
    ("negative sinks", lambda d: d["layers"][1]["decoding"]["params"].update(n_sink=-1)),
    ("tova with params", lambda d: d["layers"][0]["decoding"].update(params={"window": 3})),
    ("params not an object", lambda d: d["layers"][0]["decoding"].update(params=[])),
]


@pytest.mark.parametrize("why, change", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_strategies_fail_the_schema(why, change):
    jsonschema = pytest.importorskip("jsonschema")
    data = copy.deepcopy(mixed().to_json())
    change(data)
    assert list(jsonschema.Draft202012Validator(load_schema()).iter_errors(data)), why


@pytest.mark.parametrize("why, change", BROKEN, ids=[b[0] for b in BROKEN])
def test_what_the_schema_rejects_the_loader_rejects_too(why, change):
    from strategies import StrategyError

    data = copy.deepcopy(mixed().to_json())
    change(data)
    if why in ("unknown top-level key", "unknown layer key", "missing budget"):
        pytest.skip("the loader is lenient here; the schema documents the canonical file")
    with pytest.raises(StrategyError):
        Strategy.from_json(data)


def test_schema_lists_every_pattern_and_its_parameters_with_their_defaults():
    schema = load_schema()
    choice = schema["$defs"]["choice"]
    assert choice["properties"]["pattern"]["enum"] == list(PATTERNS)
    covered = set()
    for rule in choice["allOf"][1:]:
        cond = rule["if"]["properties"]["pattern"]
        names = cond.get("enum", [cond.get("const")])
        ref = rule["then"]["properties"]["params"]["$ref"].split("/")[-1]
        params = schema["$defs"][ref]
        for name in names:
            covered.add(name)
            fields = {f.name: f.default for f in dataclasses.fields(PATTERNS[name])}
            props = params.get("properties", {})
            assert set(props) == set(fields), name
            for key, default in fields.items():
                assert props[key].get("default") == default, (name, key)
    assert covered == set(PATTERNS)
