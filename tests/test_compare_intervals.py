"""compare on fixed results files (``tests/compare_support.py``): reading, intervals, paired differences,
gap recovered, fidelity, pairing across files, JSON. Tables and plots: ``tests/test_compare_tables.py``.
"""

from __future__ import annotations

import copy
import json
import random

import pytest

from polykv_search import compare as cmp
from polykv_search import stats
from polykv_search.cli import main
from tests.compare_support import SUITE_TASKS, V1, V2, per_sample, row, write


# -------------------------------------------------------------------------------------- reading
def test_both_results_versions_load_and_every_score_has_an_interval(v1, v2):
    for c in (v1, v2):
        assert len(c.rows) == 13 and c.suites == ["broad", "ruler"]
        for r in c.rows:
            assert set(r.task_iv) == set(c.tasks) and set(r.suite_iv) == {"broad", "ruler"}
            for suite, iv in r.suite_iv.items():
                assert iv.estimate == pytest.approx(r.suites[suite])  # the file's score is the per-sample mean
                assert iv.low <= iv.estimate <= iv.high and iv.n == 24
    assert not v1.fidelity_suites and v2.fidelity_suites == ["broad"]
    assert v2.runs[0]["engine"] == "shared" and not v2.warnings


def test_unknown_results_version_is_refused_in_one_line(tmp_path, capsys):
    doc = json.loads(V2.read_text())
    doc["version"] = 3
    path = write(tmp_path, "v3.json", doc)
    with pytest.raises(cmp.CompareError, match="unsupported results version 3 .*versions 1 and 2"):
        cmp.load_results(path)
    assert main(["compare", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "version 3" in err and "Traceback" not in err


def test_malformed_per_sample_records_are_refused(tmp_path):
    doc = json.loads(V1.read_text())
    doc["entries"][2]["tasks"]["ruler/vt"]["per_sample"][3].pop("score")
    with pytest.raises(
        cmp.CompareError, match=r"uniform-h2o.*ruler/vt.*per_sample\[3\] needs an id and a finite score"
    ):
        cmp.load_results(write(tmp_path, "bad.json", doc))


@pytest.mark.parametrize("value", ["high", None, float("nan"), float("inf")])
def test_a_score_that_is_not_a_finite_number_is_refused_naming_the_entry(value, tmp_path):
    doc = json.loads(V1.read_text())
    doc["entries"][2]["suites"]["ruler"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))  # NaN / Infinity are written as JSON's non-standard constants
    with pytest.raises(cmp.CompareError, match=r"entries\[2\] \(uniform-h2o\) suites.ruler must be a finite number"):
        cmp.load_results(path)


def test_a_task_score_that_is_not_the_per_sample_mean_is_warned_about():
    doc = json.loads(V1.read_text())
    doc["entries"][6]["scores"]["broad/manyshot"] += 5.0
    c = cmp.compare([doc], resamples=200)
    assert any("proportional-B64 scores" in w and "broad/manyshot" in w for w in c.warnings)


# ------------------------------------------------------------- intervals are the stats module's
def test_row_intervals_are_the_stratified_bootstrap_of_its_per_sample_scores(v2):
    r = row(v2, "proportional-B64")
    for suite in ("broad", "ruler"):
        assert r.suite_iv[suite] == stats.stratified_mean_interval(per_sample(r, suite))
    assert r.task_iv["ruler/vt"] == stats.mean_interval(r.samples["ruler/vt"].score)
    assert r.kl["broad"] == stats.stratified_mean_interval([r.samples["broad/continuation"].kl])


def test_difference_to_the_best_uniform_is_paired_and_marked_when_resolved(v2):
    ref = v2.reference(0, 64.0, "broad")
    assert ref.best_uniform == "uniform-snapkv"  # highest uniform broad score
    bu = row(v2, "uniform-snapkv")
    resolved = 0
    for r in v2.rows:
        if r.is_full or r is bu:
            assert r.diff.get("broad") is None
            continue
        expected = stats.paired_difference_interval(per_sample(r, "broad"), per_sample(bu, "broad"))
        assert r.diff["broad"] == expected
        mark = cmp.tables.mark(r, "broad")
        assert mark == ("" if not expected.excludes_zero else "▲" if expected.low > 0 else "▼")
        resolved += bool(mark)
    assert 0 < resolved < 11  # the fixture has both resolved and unresolved differences


def test_gap_recovered_interval_resamples_entry_uniform_and_full_jointly(v2):
    full, bu, r = row(v2, "full"), row(v2, "uniform-snapkv"), row(v2, "proportional-B64")
    expected = stats.gap_recovered_interval(per_sample(r, "broad"), per_sample(bu, "broad"), per_sample(full, "broad"))
    assert r.gap_iv["broad"] == expected and expected.defined
    assert r.gap["broad"] == pytest.approx(
        (r.suites["broad"] - bu.suites["broad"]) / (full.suites["broad"] - bu.suites["broad"])
    )
    assert v2.reference(0, 64.0, "broad").full_minus_uniform == expected.denominator


def test_kl_gap_is_measured_against_the_lowest_kl_uniform(v2):
    ref = v2.reference(0, 64.0, "broad")
    lowest = min((r for r in v2.rows if r.is_uniform), key=lambda r: r.kl["broad"].estimate)
    assert ref.kl_best_uniform == lowest.name
    r = row(v2, "proportional-B64")
    assert r.kl_gap["broad"] == stats.kl_gap_interval(
        per_sample(r, "broad", "kl")[:1], per_sample(lowest, "broad", "kl")[:1]
    )
    assert row(v2, "full").kl["broad"].estimate == 0.0 and "ruler" not in r.kl


def test_gap_is_undefined_when_full_minus_best_uniform_is_not_clearly_positive():
    doc = json.loads(V1.read_text())
    full = next(e for e in doc["entries"] if e["name"] == "full")
    snap = next(e for e in doc["entries"] if e["name"] == "uniform-snapkv")
    for t in SUITE_TASKS["ruler"]:  # FullKV ties the best uniform on ruler, sample by sample
        full["tasks"][t] = copy.deepcopy(snap["tasks"][t])
        full["scores"][t] = snap["scores"][t]
    full["suites"]["ruler"] = snap["suites"]["ruler"]
    c = cmp.compare([doc], resamples=500)
    ref = c.reference(0, 64.0, "ruler")
    assert not ref.gap_defined and "not clearly positive" in ref.gap_note
    for r in c.rows:
        if not r.is_full:
            assert r.gap["ruler"] is None and r.gap_iv["ruler"].reason == ref.gap_note and r.gap["broad"] is not None
    assert any(
        line.startswith("gap -: FullKV − best uniform (uniform-snapkv) on ruler at B=64") for line in cmp.notes(c)
    )
    md = cmp.to_markdown(c)
    assert [cell.strip() for cell in md.splitlines()[4].strip("|").split("|")][9] == "-"
    saved = c.to_json()
    prop = next(r for r in saved["rows"] if r["name"] == "proportional-B64")
    assert prop["gap_recovered"]["ruler"] is None and prop["gap_recovered_interval"]["ruler"]["reason"] == ref.gap_note


def test_unresolved_lists_every_difference_whose_interval_contains_zero(v2):
    lines = cmp.unresolved(v2)
    expected = [(r.name, s) for r in v2.rows for s, d in r.diff.items() if d is not None and not d.excludes_zero]
    assert len(lines) == len(expected) > 0
    for (name, suite), line in zip(expected, lines):
        assert line.startswith(f"{name} vs uniform-snapkv on {suite} (B=64): ") and line.endswith(", not resolved")


# ------------------------------------------------------------------------- pairing across files
def test_pairing_across_files_by_sample_id(v2):
    """Entries split over two files, one listing its samples in another order, pair exactly as in one file."""
    doc = json.loads(V2.read_text())
    a, b = copy.deepcopy(doc), copy.deepcopy(doc)
    a["entries"], b["entries"] = doc["entries"][:5], doc["entries"][5:]
    for e in b["entries"]:  # the second file lists its samples in another order
        for t in e["tasks"].values():
            random.Random(0).shuffle(t["per_sample"])
    c = cmp.compare([a, b], sources=["a.json", "b.json"])
    for name in ("proportional-B64", "pyramid", "uniform-tova"):
        assert row(c, name).diff == row(v2, name).diff
        assert row(c, name).gap_iv == row(v2, name).gap_iv
    b["entries"][1]["tasks"]["ruler/vt"]["per_sample"][0]["id"] = "another-sample"
    c = cmp.compare([a, b], resamples=200)
    r = row(c, b["entries"][1]["name"])
    assert r.diff["ruler"] is None and "different samples of ruler/vt" in r.diff_note["ruler"]
    assert r.gap_iv["ruler"].interval is None and r.diff["broad"] is not None


def test_without_per_sample_scores_the_points_remain_and_nothing_is_invented():
    doc = json.loads(V1.read_text())
    for e in doc["entries"]:
        e["tasks"] = {}
    c = cmp.compare([doc])
    assert not c.has_intervals and all(not r.suite_iv and r.diff.get("broad") is None for r in c.rows)
    r = row(c, "proportional-B64")
    assert r.gap["broad"] is not None and r.gap_iv["broad"].interval is None
    assert "±" not in cmp.to_markdown(c) and cmp.notes(c)[0] == "no per-sample scores in these results: no intervals"


# ----------------------------------------------------------------------------------------- JSON
def test_json_carries_every_interval_and_is_strict_json(v2, tmp_path):
    path = tmp_path / "c.json"
    assert main(["compare", str(V2), "--json", str(path), "--resamples", "500"]) == 0
    saved = json.loads(path.read_text())
    json.dumps(saved, allow_nan=False)
    assert saved["version"] == cmp.COMPARISON_VERSION == 2
    assert (
        saved["statistics"]["level"] == 0.95
        and saved["statistics"]["resamples"] == 500
        and saved["statistics"]["seed"] == 0
    )
    prop = next(r for r in saved["rows"] if r["name"] == "proportional-B64")
    assert set(prop["intervals"]["scores"]) == set(SUITE_TASKS["broad"] + SUITE_TASKS["ruler"])
    broad = prop["intervals"]["suites"]["broad"]
    assert broad["low"] <= broad["estimate"] <= broad["high"] and broad["method"] in ("BCa", "percentile")
    vs = prop["vs_best_uniform"]["broad"]
    assert vs["resolved"] == (vs["difference"]["low"] > 0 or vs["difference"]["high"] < 0)
    assert prop["gap_recovered_interval"]["broad"]["interval"]["estimate"] == pytest.approx(
        prop["gap_recovered"]["broad"]
    )
    assert (
        prop["fidelity"]["kl"]["broad"]["estimate"] > 0 and "interval" in prop["fidelity"]["kl_gap_recovered"]["broad"]
    )
    ref = next(r for r in saved["references"] if r["suite"] == "broad")
    assert ref["gap_defined"] and ref["full_minus_uniform"]["low"] > 0 and ref["kl_best_uniform"]


def test_json_of_single_sample_results_has_no_infinities(tmp_path):
    doc = json.loads(V1.read_text())
    for e in doc["entries"]:
        for t in e["tasks"].values():
            t["per_sample"] = t["per_sample"][:1]
            e["scores"][t["task"]] = t["per_sample"][0]["score"]
        for suite, tasks in SUITE_TASKS.items():
            e["suites"][suite] = sum(e["scores"][t] for t in tasks) / 2
    c = cmp.compare([doc])
    text = json.dumps(c.to_json(), allow_nan=False)
    assert '"method": "too-few-samples"' in text
    assert all(r.gap.get("broad") is None for r in c.rows)  # one sample: no gap is clearly there
    assert "±?" in cmp.to_markdown(c)
