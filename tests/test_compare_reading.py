"""The results reader refuses every malformed field the compare package reads, in one line naming its JSON path."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from polykv_search import compare as cmp

FIXTURES = Path(__file__).parent / "fixtures"
V1, V2 = FIXTURES / "results_v1.json", FIXTURES / "results_v2.json"
BASE = {"v1": json.loads(V1.read_text()), "v2": json.loads(V2.read_text())}


def mutated(version: str, path: list[Any], value: Any) -> dict[str, Any]:
    """The fixture with the value at ``path`` replaced by ``value``."""
    doc = copy.deepcopy(BASE[version])
    *parents, last = path
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value
    return doc


E2, TASK = ["entries", 2], "broad/continuation"
REFUSED = [
    # (fixture, path of the replaced value, value, the message after "r.json: ")
    ("v1", ["provenance"], None, "provenance: expected an object, got null"),
    ("v1", ["entries"], {}, "entries: expected a list, got an object"),
    ("v1", ["provenance", "settings"], None, "provenance.settings: expected an object, got null"),
    (
        "v1",
        ["provenance", "settings", "budget"],
        "64",
        'provenance.settings.budget: expected a finite number or null, got the string "64"',
    ),
    (
        "v1",
        ["provenance", "settings", "samples"],
        1.5,
        "provenance.settings.samples: expected an integer or null, got 1.5",
    ),
    ("v1", ["provenance", "tasks"], [], "provenance.tasks: expected an object, got a list"),
    ("v1", ["provenance", "tasks", TASK], None, f"provenance.tasks.{TASK}: expected an object, got null"),
    (
        "v1",
        ["provenance", "tasks", TASK, "suite"],
        ["broad"],
        f"provenance.tasks.{TASK}.suite: expected a string or null, got a list",
    ),
    (
        "v1",
        ["provenance", "tasks", TASK, "samples"],
        7,
        f"provenance.tasks.{TASK}.samples: expected a string or null, got 7",
    ),
    ("v1", ["provenance", "model"], {}, "provenance.model: expected a string or null, got an object"),
    ("v2", ["provenance", "engine"], True, "provenance.engine: expected a string or null, got true"),
    ("v1", [*E2, "solver"], ["uniform"], "entries[2].solver: expected a string or null, got a list"),
    ("v1", [*E2, "kind"], 3, "entries[2].kind: expected a string or null, got 3"),
    ("v1", [*E2, "strategy_digest"], {"a": 1}, "entries[2].strategy_digest: expected a string or null, got an object"),
    ("v1", [*E2, "global_budget"], float("nan"), "entries[2].global_budget: expected a finite number or null, got nan"),
    ("v1", [*E2, "kv_bytes"], "1e6", 'entries[2].kv_bytes: expected a finite number or null, got the string "1e6"'),
    ("v1", [*E2, "kv_ratio"], float("inf"), "entries[2].kv_ratio: expected a finite number or null, got inf"),
    ("v1", [*E2, "extra"], [], "entries[2].extra: expected an object or null, got a list"),
    ("v1", [*E2, "tasks"], "x", 'entries[2].tasks: expected an object or null, got the string "x"'),
    ("v1", [*E2, "tasks", TASK], [], f"entries[2].tasks.{TASK}: expected an object, got a list"),
    (
        "v1",
        [*E2, "tasks", TASK, "per_sample"],
        {},
        f"entries[2].tasks.{TASK}.per_sample: expected a list or null, got an object",
    ),
    (
        "v1",
        [*E2, "tasks", TASK, "per_sample", 0, "id"],
        [1],
        f"entries[2].tasks.{TASK}.per_sample[0].id: expected a string or integer, got a list",
    ),
    (
        "v2",
        [*E2, "tasks", TASK, "per_sample", 1, "kl"],
        "0.1",
        f'entries[2].tasks.{TASK}.per_sample[1].kl: expected a finite number or null, got the string "0.1"',
    ),
    (
        "v2",
        [*E2, "tasks", TASK, "per_sample", 1, "dnll"],
        float("nan"),
        f"entries[2].tasks.{TASK}.per_sample[1].dnll: expected a finite number or null, got nan",
    ),
    ("v1", [*E2, "strategy"], [], "entries[2].strategy: expected an object or null, got a list"),
    ("v1", [*E2, "strategy", "layers"], {}, "entries[2].strategy.layers: expected a list or null, got an object"),
    ("v1", [*E2, "strategy", "layers", 1], 5, "entries[2].strategy.layers[1]: expected an object, got 5"),
    (
        "v1",
        [*E2, "strategy", "layers", 0, "prefill"],
        None,
        "entries[2].strategy.layers[0].prefill: expected an object, got null",
    ),
    (
        "v1",
        [*E2, "strategy", "layers", 0, "decoding", "pattern"],
        ["h2o"],
        "entries[2].strategy.layers[0].decoding.pattern: expected a string, got a list",
    ),
    (
        "v1",
        [*E2, "strategy", "layers", 0, "prefill", "budget"],
        False,
        "entries[2].strategy.layers[0].prefill.budget: expected a finite number or null, got false",
    ),
    (
        "v1",
        [*E2, "strategy", "provenance"],
        "uniform",
        'entries[2].strategy.provenance: expected an object or null, got the string "uniform"',
    ),
    (
        "v1",
        [*E2, "strategy", "provenance", "settings"],
        {"pattern": {}},
        "entries[2].strategy.provenance.settings.pattern: expected a string or null, got an object",
    ),
    ("v1", [*E2, "scores", "odd\nkey"], 1.0, None),  # a new task: accepted (no per-sample records)
    ("v1", [*E2, "suites", "odd\nkey"], "high", r'entries[2] (uniform-h2o) suites."odd\nkey" must be a finite number'),
    ("v1", [*E2, "name"], ["h2o"], "entries[2] must be an object with a name (a string)"),
]


@pytest.mark.parametrize("version,path,value,message", REFUSED, ids=[".".join(map(str, r[1])) for r in REFUSED])
def test_a_malformed_field_is_refused_in_one_line_naming_its_path(version, path, value, message, tmp_path):
    doc = mutated(version, path, value)
    file = tmp_path / "r.json"
    file.write_text(json.dumps(doc))  # NaN / Infinity are written as JSON's non-standard constants
    if message is None:
        cmp.load_results(file)
        return
    with pytest.raises(cmp.CompareError) as err:
        cmp.load_results(file)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{file}: ") and message in text, text


@pytest.mark.parametrize(
    "path,value",
    [
        (["provenance", "settings", "budget"], None),
        (["provenance", "tasks", TASK, "suite"], None),  # the suite is then the task's prefix
        ([*E2, "extra"], None),
        ([*E2, "tasks"], None),
        ([*E2, "tasks", TASK, "per_sample"], None),
        ([*E2, "strategy"], None),
        ([*E2, "strategy", "provenance"], None),
        ([*E2, "kv_bytes"], None),
        ([*E2, "seconds"], "not read by compare"),
        ([*E2, "strategy", "layers", 0, "prefill", "params"], None),
    ],
)
def test_null_optional_fields_and_unread_fields_are_accepted(path, value):
    doc = mutated("v1", path, value)
    cmp.check_results(doc, "r.json")
    assert cmp.compare([doc], resamples=50).rows


@pytest.mark.parametrize("fixture", [V1, V2], ids=["v1", "v2"])
def test_valid_results_load_unchanged(fixture):
    assert cmp.load_results(fixture) == json.loads(fixture.read_text())


def test_paths_quote_keys_that_are_not_plain_words():
    doc = mutated("v1", ["provenance", "tasks", "a b.c"], {"suite": 1})
    with pytest.raises(
        cmp.CompareError, match=re.escape('r.json: provenance.tasks."a b.c".suite: expected a string or null, got 1')
    ):
        cmp.check_results(doc, "r.json")


def test_an_entry_whose_strategy_has_head_groups_is_read_and_compared():
    groups = {
        "head_groups": [{"heads": [0], "pattern": "full", "budget": 64}, {"heads": [1], "pattern": "tova", "budget": 8}]
    }
    doc = mutated("v1", [*E2, "strategy", "layers", 0, "prefill"], groups)
    cmp.check_results(doc, "r.json")
    assert cmp.compare([doc], resamples=50).rows
    bad = mutated("v1", [*E2, "strategy", "layers", 0, "prefill"], {"head_groups": [{"heads": [0], "budget": 8}]})
    with pytest.raises(cmp.CompareError, match=r"head_groups\[0\]\.pattern"):
        cmp.check_results(bad, "r.json")
