"""Strategy schema v2: head groups per (layer, phase), their validation, JSON round trips, v1 unchanged."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import torch

from polykv_search.cli import main
from polykv_search.runtime import apply_strategy
from strategies import HeadGroup, LayerChoice, Strategy, StrategyError
from strategies.export_json import load_schema
from strategies.exporters import ExportError, ExportOptions, render_export
from tests.tiny import tiny_model

ROOT = Path(__file__).resolve().parent.parent


def grouped(*groups) -> LayerChoice:
    return LayerChoice.grouped(HeadGroup(*g) for g in groups)


def duo_like() -> Strategy:
    """Layer 0: one full head beside two streaming heads; layer 1: layer-level snapkv."""
    g = grouped(((1,), "full", 1024), ((0, 2), "streaming_llm", 48, {"n_sink": 2}))
    return Strategy(
        [g, LayerChoice("snapkv", 64)],
        [g, LayerChoice("tova", 64)],
        global_budget=256,
        b_min=16,
        provenance={"solver": "test"},
        context_len=1024,
        num_kv_heads=3,
    )


def test_layer_budget_is_the_mean_over_kv_heads_capped_at_the_context_length():
    s = duo_like()
    assert s.budgets("prefill") == [pytest.approx((1024 + 2 * 48) / 3), 64]
    capped = grouped(((1,), "full", 5000), ((0, 2), "streaming_llm", 48))  # above n counts as n
    t = Strategy([capped], [capped], 400, 1, {}, context_len=1024, num_kv_heads=3)
    assert t.budgets("decoding") == [pytest.approx((1024 + 96) / 3)]
    whole = grouped(((0, 1, 2), "snapkv", 30))
    assert Strategy([whole], [whole], 30, 1, {}, context_len=64, num_kv_heads=3).budgets("prefill") == [30]


def test_runtime_api_says_which_layers_have_head_groups_and_iterates_them():
    s = duo_like()
    assert s.has_head_groups and s.version == 2 and s.first_head_groups() == "layers[0].prefill"
    groups = s.head_groups(0, "decoding")
    assert [(g.heads, g.pattern, dict(g.params), g.budget) for g in groups] == [
        ((1,), "full", {}, 1024),
        ((0, 2), "streaming_llm", {"n_sink": 2}, 48),
    ]
    assert s.head_groups(1, "prefill") is None and s.phase("prefill")[1].pattern == "snapkv"
    assert s.phase("prefill")[0].pattern == "head_groups" and not s.is_full
    again = Strategy(s.prefill, s.decoding, s.global_budget, s.b_min, s.provenance, s.context_len, s.num_kv_heads)
    assert again == s  # choices that already carry their mean budget are accepted as they are


def test_head_group_strategies_round_trip_as_version_2(tmp_path):
    s = duo_like()
    back = Strategy.load(s.save(tmp_path / "s.json"))
    assert back == s and back.dumps() == s.dumps() and back.digest() == s.digest()
    doc = json.loads(s.dumps())
    assert doc["version"] == 2 and doc["context_len"] == 1024 and doc["num_kv_heads"] == 3
    assert doc["layers"][0]["prefill"] == {
        "head_groups": [
            {"heads": [1], "pattern": "full", "budget": 1024, "params": {}},
            {"heads": [0, 2], "pattern": "streaming_llm", "budget": 48, "params": {"n_sink": 2}},
        ]
    }
    assert doc["layers"][1]["prefill"] == {"pattern": "snapkv", "budget": 64, "params": {}}


def _strategy_docs():
    """Every strategy document stored in the repository (files and strategies embedded in results)."""
    files = subprocess.run(["git", "ls-files", "*.json"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    found = []
    for name in files:
        try:
            data = json.loads((ROOT / name).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        stack = [data]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if node.get("schema") == "polykv-strategy" and "layers" in node:
                    found.append((name, node))
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    return found


def test_every_strategy_in_the_repository_loads_unchanged():
    docs = _strategy_docs()
    assert len([d for _, d in docs if d["version"] == 1]) >= 10
    for name, doc in docs:
        s = Strategy.from_json(copy.deepcopy(doc))
        assert s.version == doc["version"] and s.has_head_groups == (doc["version"] == 2), name
        again = s.to_json()
        assert again == {**doc, "num_layers": len(doc["layers"]), "b_min": doc.get("b_min", 1)}, name
        assert Strategy.from_json(again) == s


def test_version_1_output_is_byte_identical_to_before():
    s = Strategy([LayerChoice("snapkv", 40, {"window": 8})], [LayerChoice("tova", 32)], 40, 16, {"solver": "x"})
    assert s.dumps() == (
        '{\n  "schema": "polykv-strategy",\n  "version": 1,\n  "num_layers": 1,\n  "global_budget": 40,\n'
        '  "b_min": 16,\n  "layers": [\n    {\n      "layer": 0,\n      "prefill": {\n        "pattern": "snapkv",\n'
        '        "budget": 40,\n        "params": {\n          "window": 8\n        }\n      },\n      "decoding": {\n'
        '        "pattern": "tova",\n        "budget": 32,\n        "params": {}\n      }\n    }\n  ],\n'
        '  "provenance": {\n    "solver": "x"\n  }\n}\n'
    )


def _doc():
    return duo_like().to_json()


def _groups(d, layer=0, phase="prefill"):
    return d["layers"][layer][phase]["head_groups"]


BAD = [
    ("heads missing", lambda d: _groups(d)[0].pop("heads"), r"layers\[0\]\.prefill\.head_groups\[0\]\.heads: missing"),
    ("empty group", lambda d: _groups(d)[0].update(heads=[]), r"head_groups\[0\]\.heads: empty group"),
    ("repeated head", lambda d: _groups(d)[1].update(heads=[0, 1]), r"head_groups\[1\]\.heads: head 1 is repeated"),
    ("twice in a group", lambda d: _groups(d)[1].update(heads=[0, 0, 2]), r"head 0 is repeated \(twice"),
    ("out of range", lambda d: _groups(d)[1].update(heads=[0, 3]), r"head 3 is out of range for num_kv_heads=3"),
    ("negative head", lambda d: _groups(d)[1].update(heads=[-1, 0, 2]), r"head -1 is out of range"),
    ("non-integer head", lambda d: _groups(d)[1].update(heads=[0, "2"]), r"'2' is not an integer KV head"),
    ("heads not covered", lambda d: _groups(d)[1].update(heads=[0]), r"head_groups: heads \[2\] are in no group"),
    ("no groups", lambda d: d["layers"][0]["prefill"].update(head_groups=[]), r"prefill\.head_groups: must be a non"),
    (
        "bad pattern",
        lambda d: _groups(d, 0, "decoding")[1].update(pattern="nope"),
        r"decoding\.head_groups\[1\]\.pattern",
    ),
    ("bad params", lambda d: _groups(d)[1].update(params={"n_sink": -1}), r"head_groups\[1\]\.params"),
    ("negative budget", lambda d: _groups(d)[1].update(budget=-1), r"head_groups\[1\]\.budget: must be non-negative"),
    ("null budget", lambda d: _groups(d)[1].update(budget=None), r"head_groups\[1\]\.budget: must be an integer"),
    ("unknown group key", lambda d: _groups(d)[1].update(extra=1), r"head_groups\[1\]: unknown keys \['extra'\]"),
    ("extra key beside groups", lambda d: d["layers"][0]["prefill"].update(budget=3), r"has no other keys"),
    ("no num_kv_heads", lambda d: d.pop("num_kv_heads"), r"^num_kv_heads: required when a layer has head groups"),
    ("no context_len", lambda d: d.pop("context_len"), r"^context_len: required when a layer has head groups"),
    ("bad context_len", lambda d: d.update(context_len=0), r"^context_len: must be a positive integer"),
    ("v1 with groups", lambda d: (d.update(version=1), d.pop("context_len")), r"^num_kv_heads: needs a version 2"),
    (
        "v1 groups only",
        lambda d: (d.update(version=1), d.pop("context_len"), d.pop("num_kv_heads")),
        r"layers\[0\]\.prefill\.head_groups: needs a version 2 file",
    ),
    ("over the budget", lambda d: d.update(global_budget=100), r"^prefill: budgets sum to 437\.33.*over L\*B"),
    (
        "mean below b_min",
        lambda d: _groups(d)[0].update(pattern="streaming_llm", budget=0) or d.update(b_min=40),
        r"mean budget 32 is below",
    ),
    (  # a keep-all group holds the whole context: a smaller budget would undercount it in B
        "full group under the context",
        lambda d: _groups(d)[0].update(budget=1),
        r"head_groups\[0\]\.budget: pattern 'full' keeps every token, so it holds the whole 1024-token context",
    ),
]


@pytest.mark.parametrize("why, change, message", BAD, ids=[b[0] for b in BAD])
def test_bad_head_groups_are_refused_naming_the_field(why, change, message):
    data = _doc()
    change(data)
    with pytest.raises(StrategyError, match=message) as err:
        Strategy.loads(json.dumps(data))
    assert "\n" not in str(err.value)


def test_objects_are_checked_like_files():
    with pytest.raises(StrategyError, match=r"layers\[0\]\.prefill\.pattern: a choice with head_groups"):
        Strategy(
            [LayerChoice("snapkv", 8, {}, (HeadGroup((0,), "full", 8),))], [LayerChoice("snapkv", 8)], None, 1, {}, 8, 1
        )
    with pytest.raises(StrategyError, match=r"head_groups\[0\]\.heads: must be a list"):
        Strategy([grouped((None, "full", 8))], [LayerChoice("snapkv", 8)], None, 1, {}, 8, 1)


def test_check_model_needs_and_checks_the_kv_heads():
    s = duo_like()
    with pytest.raises(StrategyError, match=r"layers\[0\]\.prefill\.head_groups: this runtime cannot apply"):
        s.check_model(2)  # what today's runtime calls: it refuses head groups with one line
    with pytest.raises(
        StrategyError, match=r"num_kv_heads: strategy has head groups over 3 KV heads but the model has 4"
    ):
        s.check_model(2, 4)
    s.check_model(2, 3)
    Strategy.uniform(2, "tova", 8).check_model(2)  # layer-level strategies are unaffected


@pytest.mark.parametrize("fmt, out", [("trtllm", "x.yaml"), ("vllm", "x.json")])
def test_window_exporters_refuse_head_groups_unless_approximate(
    fmt, out, tmp_path
):  # kvpress: test_export_kvpress_heads
    with pytest.raises(
        ExportError,
        match=rf"^{fmt} cannot express head groups \(layers\[0\]\.prefill\): .*json, or --approximate .*tokens$",
    ):
        render_export(duo_like(), fmt, tmp_path / out)
    path = duo_like().save(tmp_path / "s.json")
    argv = ["export", str(path), "--format", fmt, "--out", str(tmp_path / out)]
    assert main(argv) == 2
    assert not (tmp_path / out).exists()


def test_vllm_approximates_a_layer_with_a_full_head_by_a_full_layer(tmp_path, capsys):
    path = duo_like().save(tmp_path / "s.json")
    argv = ["export", str(path), "--format", "vllm", "--approximate", "--out", str(tmp_path / "x.json")]
    assert main(argv) == 0
    body = json.loads((tmp_path / "x.json").read_text())
    assert body["layer_types"] == ["full_attention", "sliding_attention"] and body["sliding_window"] == 64
    err = " ".join(capsys.readouterr().err.split())
    assert "layer 0: prefill head groups full@1024[1] + streaming_llm[n_sink=2]@48[0,2] -> full for every head" in err
    assert "(each head holds every token, the groups' mean 373.3)" in err


def test_cover_of_head_groups_keeps_every_heads_tokens():
    from strategies.exporters import cover_head_groups

    full_head = grouped(((1,), "full", 1024), ((0, 2), "streaming_llm", 48))
    assert cover_head_groups(full_head, 1024) == LayerChoice("full", None)
    at_context = grouped(((0,), "snapkv", 1024), ((1, 2), "h2o", 64))  # a budget >= context_len keeps all
    assert cover_head_groups(at_context, 1024) == LayerChoice("full", None)
    # streaming heads: the most sinks (8) and the longest recent part (48 - 2 = 46) in one window
    streams = grouped(((0,), "streaming_llm", 48, {"n_sink": 2}), ((1, 2), "streaming_llm", 32, {"n_sink": 8}))
    assert cover_head_groups(streams, 1024) == LayerChoice("streaming_llm", 54, {"n_sink": 8})
    scored = grouped(((0,), "h2o", 96), ((1, 2), "streaming_llm", 32))  # the largest group's pattern and budget
    assert cover_head_groups(scored, 1024) == LayerChoice("h2o", 96, {})


def test_trtllm_takes_the_sinks_of_a_covered_streaming_layer_as_its_own(tmp_path):
    streams = grouped(((0,), "streaming_llm", 48, {"n_sink": 2}), ((1, 2), "streaming_llm", 32, {"n_sink": 2}))
    s = Strategy(
        [streams, LayerChoice("full", 1024)],
        [streams, LayerChoice("full", 1024)],
        global_budget=None,
        b_min=16,
        provenance={},
        context_len=1024,
        num_kv_heads=3,
    )
    export = render_export(s, "trtllm", tmp_path / "x.yaml", ExportOptions(approximate=True, max_seq_len=4096))
    text = next(iter(export.files.values()))
    assert "    - 48  # layer 0: streaming_llm(n_sink=2) budget 48" in text and "sink_token_length: 2" in text
    assert [w.split(" -> ")[1].split(" for")[0] for w in export.warnings] == ["streaming_llm(n_sink=2) budget 48"] * 2


def test_json_export_carries_the_head_groups(tmp_path):
    path = duo_like().save(tmp_path / "s.json")
    assert main(["export", str(path), "--format", "json", "--out", str(tmp_path / "o.json")]) == 0
    assert Strategy.load(tmp_path / "o.json") == duo_like()


def test_schema_accepts_v2_and_lists_the_same_pattern_rules_for_groups():
    jsonschema = pytest.importorskip("jsonschema")

    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(_doc()))
    assert schema["$defs"]["head_group"]["allOf"] == schema["$defs"]["choice"]["allOf"][1:]
    bad = _doc()
    _groups(bad)[0]["heads"] = []
    assert list(validator.iter_errors(bad))
    v1 = _doc()
    v1["version"] = 1
    assert list(validator.iter_errors(v1))  # version 1 has no head groups


def test_show_prints_the_groups_and_the_mean_budgets(tmp_path, capsys):
    path = duo_like().save(tmp_path / "s.json")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "373.3" in out and "head groups over 3 KV heads, built for 1024-token contexts" in out


def test_apply_strategy_builds_a_group_layer_for_a_strategy_with_head_groups():
    g = grouped(((0,), "full", 64), ((1,), "streaming_llm", 8))
    s = Strategy([g, LayerChoice("snapkv", 10)], [g, LayerChoice("h2o", 10)], 36, 1, {}, context_len=64, num_kv_heads=2)
    model = tiny_model("llama", layers=2)
    ids = torch.randint(1, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), apply_strategy(model, s) as rt:
        model(ids, use_cache=True)
        layer0, layer1 = rt.last_cache.layers
    assert [part.length for part in layer0.parts] == [30, 8]  # head 0 keeps all, head 1 sinks + recent
    assert layer1.length == 10
    with pytest.raises(StrategyError, match="num_kv_heads: strategy has head groups over 2 KV heads"):
        with apply_strategy(tiny_model("llama", layers=2, num_key_value_heads=4), s):
            pass
