"""The signal table file: versioned, self-describing, filled cell by cell, loaded with one call."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from signals import SignalTable, SignalTableError, random_signal_table
from signals.table import SCHEMA_NAME, SCHEMA_VERSION
from strategies import PHASES


def small_table() -> SignalTable:
    t = SignalTable.empty(
        3, ["decoding", "prefill"], ["snapkv", "tova"], [64, 32, 128], {"model": "tiny", "code_version": "0"}
    )
    for layer in range(3):
        for phase in t.phases:
            t.set_layer(layer, phase, entropy=0.5 + 0.1 * layer, variance=1e-3 * (layer + 1))
            for i, pattern in enumerate(t.patterns):
                for b in t.budgets:
                    t.set_cell(layer, phase, pattern, b, cosine=1 - 1 / b - 0.01 * i, dppl=10 / b + layer, kl=1 / b)
    t.set_full_ppl(12.5)
    return t


# ------------------------------------------------------------------------ building
def test_empty_table_has_the_grid_and_only_missing_values():
    t = SignalTable.empty(4, ["decoding", "prefill"], ["tova", "snapkv"], [128, 32, 64])
    assert t.phases == PHASES  # canonical phase order
    assert t.patterns == ("tova", "snapkv")  # pattern order kept
    assert t.budgets == (32, 64, 128)  # grid sorted
    assert t.cosine_array().shape == (4, 2, 2, 3) == t.shape
    assert t.dppl_array().shape == (4, 2, 2, 3)
    assert t.entropy_array().shape == t.variance_array().shape == (4, 2)
    assert np.isnan(t.cosine_array()).all() and np.isnan(t.entropy_array()).all()
    assert t.full_ppl is None and not t.is_complete()
    assert len(t.missing_cells()) == 4 * 2 * 2 * 3


def test_set_cell_and_set_layer_fill_exactly_one_place():
    t = SignalTable.empty(2, PHASES, ["snapkv", "h2o"], [16, 32])
    t.set_cell(1, "decoding", "h2o", 16, cosine=0.75)
    t.set_cell(1, "decoding", "h2o", 16, dppl=0.25)  # the other argument is left alone
    assert (1, "decoding", "h2o", 16) in t.missing_cells()  # KL still missing
    t.set_cell(1, "decoding", "h2o", 16, kl=0.01)
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
        (lambda t: t.set_cell(0, "prefill", "snapkv", 32, dppl=float("inf")), "dppl"),
        (lambda t: t.set_cell(0, "prefill", "snapkv", 32, se={"kl": -1.0}), "se.kl"),
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
    t.set_cell(2, "prefill", "tova", 128, cosine=float("nan"))  # missing
    path = t.save(tmp_path / "sub" / "signals.json")
    assert [p.name for p in path.parent.iterdir()] == ["signals.json"]  # atomic: no temp file left
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA_NAME and data["version"] == SCHEMA_VERSION == 2
    assert data["cosine"][2][0][1][2] is None and data["uncertainty"] is None
    u = SignalTable.load(path)
    assert u == t
    assert u.digest() == t.digest()
    assert u.provenance == {"model": "tiny", "code_version": "0"}
    assert u.full_ppl == 12.5
    assert math.isnan(u.cell(2, "prefill", "tova", 128)[0])
    np.testing.assert_array_equal(u.dppl_array(), t.dppl_array())
    np.testing.assert_array_equal(u.kl_array(), t.kl_array())


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
    assert np.diff(d, axis=-1).mean() < 0  # degradation falls as the budget grows, on average


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
        (_mutate(lambda d: d.update(version=99)), "version: unsupported signal table version 99"),
        (_mutate(lambda d: d.update(version="2")), "version: unsupported signal table version '2'"),
        (_mutate(lambda d: d.pop("dppl")), "dppl: missing"),
        (_mutate(lambda d: d.update(extra=1)), "signals: unknown keys"),
        (_mutate(lambda d: d.update(num_layers=4)), r"cosine: expected 4 layers"),
        (_mutate(lambda d: d["cosine"][1][0].pop()), r"cosine\[1\]\[0\]: expected 2 patterns"),
        (_mutate(lambda d: d["dppl"][0][1][0].append(1.0)), r"dppl\[0\]\[1\]\[0\]: expected 3 budgets"),
        (_mutate(lambda d: d["dppl"][0][1][0].__setitem__(2, "x")), r"dppl\[0\]\[1\]\[0\]\[2\]: expected a number"),
        (_mutate(lambda d: d["dppl"][0][1][0].__setitem__(2, "inf")), r"dppl\[0\]\[1\]\[0\]\[2\]: not a finite number"),
        (
            _mutate(lambda d: d["kl"][2][0][1].__setitem__(0, float("nan"))),
            r"kl\[2\]\[0\]\[1\]\[0\]: not a finite number",
        ),
        (
            _mutate(lambda d: d["cosine"][1][1][0].__setitem__(1, float("-inf"))),
            r"cosine\[1\]\[1\]\[0\]\[1\]: not a finite number",
        ),
        (_mutate(lambda d: d["entropy"][1].__setitem__(0, float("nan"))), r"entropy\[1\]\[0\]: not a finite number"),
        (_mutate(lambda d: d.update(uncertainty={"se_dof": 0, "se": {}})), "uncertainty.se_dof"),
        (_mutate(lambda d: d.update(uncertainty=[])), "uncertainty: must be an object"),
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


# ------------------------------------------------------------------ versions and uncertainty
def version_1_document() -> dict:
    """A table as the version-1 code wrote it: cosine and ΔPPL only, no KL, no uncertainty."""
    d = _valid()
    d["version"] = 1
    for key in ("kl", "uncertainty"):
        d.pop(key)
    return d


def test_a_version_1_table_loads_without_kl_or_uncertainty(tmp_path):
    u = SignalTable.load(_write(tmp_path, version_1_document()))
    assert u.signals == ("cosine", "dppl")
    np.testing.assert_array_equal(u.dppl_array(), small_table().dppl_array())
    assert np.isnan(u.kl_array()).all() and np.isnan(u.se_array("dppl")).all()
    assert not u.has_uncertainty and u.n_samples is None and u.per_sample_array("dppl") is None
    assert u.is_complete()  # complete for the signals it carries
    assert not u.indistinguishable().any()  # no SE: nothing can be called indistinguishable
    again = SignalTable.loads(u.dumps())  # written back as version 2 with "kl": null
    assert json.loads(u.dumps())["kl"] is None and again == u
    with pytest.raises(SignalTableError, match="^kl: this table does not carry"):
        u.set_cell(0, "prefill", "snapkv", 32, kl=0.1)
    bad = version_1_document()
    bad["kl"] = bad["dppl"]
    with pytest.raises(SignalTableError, match=r"^signals: unknown keys \['kl'\] for version 1"):
        SignalTable.load(_write(tmp_path, bad))


def test_uncertainty_round_trips_and_per_sample_values_are_kept(tmp_path):
    t = small_table()
    t.set_se_dof(7)
    t.set_cell(
        0,
        "prefill",
        "snapkv",
        32,
        se={"dppl": 0.5, "cosine": 0.01, "kl": 0.02},
        per_sample={"dppl": [1.0, 2.0], "cosine": [0.9, 0.8], "kl": [0.1, 0.2]},
    )
    assert t.n_samples == 2 and t.has_uncertainty
    u = SignalTable.load(t.save(tmp_path / "u.json"))
    assert u == t and u.se_dof == 7
    assert u.per_sample_array("dppl")[0, 0, 0, 0].tolist() == [1.0, 2.0]
    assert np.isnan(u.per_sample_array("kl")[1]).all()  # cells without samples stay missing
    with pytest.raises(SignalTableError, match="per_sample: 3 values, but this table holds 2"):
        t.set_cell(0, "prefill", "snapkv", 64, per_sample={"dppl": [1, 2, 3], "cosine": [1, 1, 1], "kl": [0, 0, 0]})


def test_intervals_use_student_t_and_mark_cells_indistinguishable_from_fullkv():
    from scipy import stats

    t = SignalTable.empty(1, ["prefill"], ["snapkv"], [8, 16, 32])
    t.set_se_dof(3)  # 4 (sample, block) units
    q = stats.t.ppf(0.975, 3)  # 3.18
    for b, (dppl, se) in zip((8, 16, 32), [(5.0, 1.0), (-0.3, 0.1), (0.2, 0.1)]):
        t.set_cell(
            0,
            "prefill",
            "snapkv",
            b,
            cosine=0.9,
            dppl=dppl,
            kl=abs(dppl) / 10,
            se={"dppl": se, "kl": se / 10, "cosine": 0.5},
        )
    lo, hi = t.interval("dppl")
    np.testing.assert_allclose(lo[0, 0, 0], [5 - q, -0.3 - 0.1 * q, 0.2 - 0.1 * q])
    # 5 ± 3.18: clearly worse than FullKV; -0.3 ± 0.32 and 0.2 ± 0.32 both contain 0
    assert t.indistinguishable("dppl")[0, 0, 0].tolist() == [False, True, True]
    assert t.indistinguishable("cosine")[0, 0, 0].tolist() == [True, True, True]  # SE 0.5 around 0.9 contains 1
    assert t.indistinguishable("dppl", level=0.5)[0, 0, 0].tolist() == [False, False, False]
