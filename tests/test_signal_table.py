"""The signal table file: versioned, self-describing, filled cell by cell, loaded with one call."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from signals import SignalTable, SignalTableError, random_signal_table
from signals.table import SCHEMA_NAME, SCHEMA_VERSION


def small_table() -> SignalTable:
    t = SignalTable.empty(3, ["decoding", "prefill"], ["snapkv", "tova"], [64, 32, 128], {"model": "tiny", "code_version": "0"})
    for layer in range(3):
        for phase in t.phases:
            t.set_layer(layer, phase, entropy=0.5 + 0.1 * layer, variance=1e-3 * (layer + 1))
            for i, pattern in enumerate(t.patterns):
                for b in t.budgets:
                    t.set_cell(layer, phase, pattern, b, cosine=1 - 1 / b - 0.01 * i, dppl=10 / b + layer)
    t.set_full_ppl(12.5)
    return t


# ------------------------------------------------------------------------ building
def test_empty_table_has_the_grid_and_only_missing_values():
    t = SignalTable.empty(4, ["decoding", "prefill"], ["tova", "snapkv"], [128, 32, 64])
    assert t.phases == ("prefill", "decoding")  # canonical phase order
    assert t.patterns == ("tova", "snapkv")  # pattern order kept
    assert t.budgets == (32, 64, 128)  # grid sorted
    assert t.cosine_array().shape == (4, 2, 2, 3) == t.shape
    assert t.dppl_array().shape == (4, 2, 2, 3)
    assert t.entropy_array().shape == t.variance_array().shape == (4, 2)
    assert np.isnan(t.cosine_array()).all() and np.isnan(t.entropy_array()).all()
    assert t.full_ppl is None and not t.is_complete()
    assert len(t.missing_cells()) == 4 * 2 * 2 * 3


def test_set_cell_and_set_layer_fill_exactly_one_place():
    t = SignalTable.empty(2, ["prefill", "decoding"], ["snapkv", "h2o"], [16, 32])
    t.set_cell(1, "decoding", "h2o", 16, cosine=0.75)
    t.set_cell(1, "decoding", "h2o", 16, dppl=0.25)  # the other argument is left alone
    t.set_layer(0, "prefill", entropy=0.3, variance=0.01)
    cos, dppl = t.cosine_array(), t.dppl_array()
    assert cos[1, 1, 1, 0] == 0.75 and dppl[1, 1, 1, 0] == 0.25
    assert np.isnan(cos).sum() == cos.size - 1
    assert t.cell(1, "decoding", "h2o", 16) == (0.75, 0.25)
    assert t.entropy_array()[0, 0] == 0.3 and t.variance_array()[0, 0] == 0.01
    assert (1, "decoding", "h2o", 16) not in t.missing_cells()


def test_accessors_return_copies():
    t = small_table()
    a = t.cosine_array()
    a[...] = 0
    assert t.cosine_array()[0, 0, 0, 0] != 0


def test_complete_table():
    assert small_table().is_complete()
    assert small_table().missing_cells() == []


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda t: t.set_cell(3, "prefill", "snapkv", 32, cosine=1.0), "layer"),
        (lambda t: t.set_cell(-1, "prefill", "snapkv", 32, cosine=1.0), "layer"),
        (lambda t: t.set_cell(0, "decode", "snapkv", 32, cosine=1.0), "phase"),
        (lambda t: t.set_cell(0, "prefill", "nope", 32, cosine=1.0), "pattern"),
        (lambda t: t.set_cell(0, "prefill", "snapkv", 33, cosine=1.0), "budget"),
        (lambda t: t.set_cell(0, "prefill", "snapkv", 32, cosine="high"), "cosine"),
        (lambda t: t.set_layer(0, "prefill", entropy=[1.0]), "entropy"),
        (lambda t: t.set_full_ppl(-1.0), "full_ppl"),
        (lambda t: t.set_full_ppl(float("nan")), "full_ppl"),
    ],
)
def test_filling_errors_name_the_field(call, field):
    with pytest.raises(SignalTableError, match=f"^{field}"):
        call(small_table())


@pytest.mark.parametrize(
    "args, field",
    [
        ((0, ["prefill"], ["snapkv"], [32]), "num_layers"),
        ((2, [], ["snapkv"], [32]), "phases"),
        ((2, ["prefil"], ["snapkv"], [32]), "phases"),
        ((2, ["prefill"], [], [32]), "patterns"),
        ((2, ["prefill"], ["snapkv", "snapkv"], [32]), "patterns"),
        ((2, ["prefill"], ["snapkv"], []), "budgets"),
        ((2, ["prefill"], ["snapkv"], [0, 32]), "budgets"),
        ((2, ["prefill"], ["snapkv"], [32, 32]), "budgets"),
        ((2, ["prefill"], ["snapkv"], [32.5]), "budgets"),
    ],
)
def test_bad_grids_are_refused(args, field):
    with pytest.raises(SignalTableError, match=f"^{field}"):
        SignalTable.empty(*args)


# ------------------------------------------------------------------------ file I/O
def test_save_load_round_trip(tmp_path):
    t = small_table()
    t.set_cell(2, "prefill", "tova", 128, cosine=float("nan"), dppl=float("inf"))  # missing and overflowed
    path = t.save(tmp_path / "sub" / "signals.json")
    assert [p.name for p in path.parent.iterdir()] == ["signals.json"]  # atomic: no temp file left
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA_NAME and data["version"] == SCHEMA_VERSION
    assert data["cosine"][2][0][1][2] is None and data["dppl"][2][0][1][2] == "inf"
    u = SignalTable.load(path)
    assert u == t
    assert u.digest() == t.digest()
    assert u.provenance == {"model": "tiny", "code_version": "0"}
    assert u.full_ppl == 12.5
    assert math.isinf(u.cell(2, "prefill", "tova", 128)[1])
    np.testing.assert_array_equal(u.dppl_array(), t.dppl_array())


def test_save_overwrites_and_partial_tables_round_trip(tmp_path):
    t = SignalTable.empty(2, ["prefill"], ["snapkv"], [8, 16])
    p = tmp_path / "s.json"
    t.save(p)
    assert SignalTable.load(p) == t
    t.set_cell(0, "prefill", "snapkv", 8, cosine=0.5, dppl=1.0)
    t.save(p)
    assert SignalTable.load(p).cell(0, "prefill", "snapkv", 8) == (0.5, 1.0)


def test_random_table_round_trips_exactly(tmp_path):
    t = random_signal_table(5, seed=7, missing=0.2)
    assert SignalTable.load(t.save(tmp_path / "r.json")) == t


def test_digest_is_a_content_hash():
    a, b = small_table(), small_table()
    assert a.digest() == b.digest() and len(a.digest()) == 16
    b.provenance["timings"] = {"total_s": 3.0}
    assert a.digest() == b.digest()  # provenance does not change the content hash
    b.set_cell(0, "prefill", "snapkv", 32, dppl=123.0)
    assert a.digest() != b.digest()


def test_random_table_is_deterministic_under_seed():
    assert random_signal_table(4, seed=1) == random_signal_table(4, seed=1)
    assert random_signal_table(4, seed=1).digest() != random_signal_table(4, seed=2).digest()
    t = random_signal_table(6, seed=3)
    assert t.is_complete()
    d = t.dppl_array()
    assert (np.diff(d, axis=-1).mean() < 0)  # degradation falls as the budget grows, on average


def _write(tmp_path, obj) -> str:
    p = tmp_path / "bad.json"
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def _valid() -> dict:
    return small_table().to_json()


def _mutate(fn):
    d = _valid()
    fn(d)
    return d


@pytest.mark.parametrize(
    "content, field",
    [
        ("{not json", "signals: not valid JSON"),
        ([1, 2], "signals: the top level"),
        (_mutate(lambda d: d.update(schema="polykv-strategy")), "schema"),
        (_mutate(lambda d: d.update(version=2)), "version"),
        (_mutate(lambda d: d.pop("dppl")), "dppl: missing"),
        (_mutate(lambda d: d.update(extra=1)), "signals: unknown keys"),
        (_mutate(lambda d: d.update(num_layers=4)), r"cosine: expected 4 layers"),
        (_mutate(lambda d: d["cosine"][1][0].pop()), r"cosine\[1\]\[0\]: expected 2 patterns"),
        (_mutate(lambda d: d["dppl"][0][1][0].append(1.0)), r"dppl\[0\]\[1\]\[0\]: expected 3 budgets"),
        (_mutate(lambda d: d["dppl"][0][1][0].__setitem__(2, "x")), r"dppl\[0\]\[1\]\[0\]\[2\]: expected a number"),
        (_mutate(lambda d: d["entropy"].__setitem__(0, 0.5)), r"entropy\[0\]: expected a list"),
        (_mutate(lambda d: d.update(budgets=[128, 64, 32])), "budgets: must be strictly increasing"),
        (_mutate(lambda d: d.update(phases=["decoding", "prefill"])), "phases: must be in the order"),
        (_mutate(lambda d: d.update(phases=["prefill", "generate"])), "phases"),
        (_mutate(lambda d: d.update(full_ppl="12")), "full_ppl"),
        (_mutate(lambda d: d.update(provenance=[])), "provenance"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path, content, field):
    with pytest.raises(SignalTableError, match=f"^{field}") as info:
        SignalTable.load(_write(tmp_path, content))
    assert "\n" not in str(info.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(SignalTableError, match="cannot read"):
        SignalTable.load(tmp_path / "missing.json")
    with pytest.raises(SignalTableError, match="cannot read"):
        SignalTable.load(tmp_path)  # a directory
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SignalTableError, match="not a UTF-8"):
        SignalTable.load(p)
