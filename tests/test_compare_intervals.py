"""compare on fixed results files: intervals, paired differences, gap recovered, fidelity, tables, JSON, plots.

``tests/fixtures/results_v1.json`` and ``results_v2.json`` are hand-made results of one run: 13 entries
(FullKV, 4 uniform baselines, pyramid, 7 solver strategies) at B = 64, 2 suites (broad: continuation,
manyshot; ruler: niah_single, vt), 12 samples per task with per-sample scores; v2 adds per-sample
KL / ΔNLL on broad/continuation, ``provenance.engine`` and null entry seconds.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from polykv_search import compare as cmp
from polykv_search import stats
from polykv_search.cli import main
from polykv_search.compare.plots import _yerr

FIXTURES = Path(__file__).parent / "fixtures"
V1, V2 = FIXTURES / "results_v1.json", FIXTURES / "results_v2.json"
SUITE_TASKS = {"broad": ["broad/continuation", "broad/manyshot"], "ruler": ["ruler/niah_single", "ruler/vt"]}


@pytest.fixture(scope="module")
def v1():
    return cmp.compare([cmp.load_results(V1)], sources=[str(V1)])


@pytest.fixture(scope="module")
def v2():
    return cmp.compare([cmp.load_results(V2)], sources=[str(V2)])


def row(c: cmp.Comparison, name: str) -> cmp.Row:
    (r,) = [r for r in c.rows if r.name == name]
    return r


def per_sample(r: cmp.Row, suite: str, measure: str = "score") -> list[np.ndarray]:
    return [np.asarray(r.samples[t].values(measure)) for t in SUITE_TASKS[suite]]


def write(tmp_path, name: str, d: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return str(path)


# ------------------------------------------------------------------------------------ reading
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
        line.startswith("gap n/a: FullKV − best uniform (uniform-snapkv) on ruler at B=64") for line in cmp.notes(c)
    )
    md = cmp.to_markdown(c)
    assert [cell.strip() for cell in md.splitlines()[4].strip("|").split("|")][9] == "n/a"
    saved = c.to_json()
    prop = next(r for r in saved["rows"] if r["name"] == "proportional-B64")
    assert prop["gap_recovered"]["ruler"] is None and prop["gap_recovered_interval"]["ruler"]["reason"] == ref.gap_note


# ------------------------------------------------------------------------ pairing across files
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


# -------------------------------------------------------------------------------------- tables
def test_markdown_shows_score_plus_minus_half_width_and_the_difference_columns(v2):
    lines = cmp.to_markdown(v2).splitlines()
    assert lines[0] == (
        "| entry | B | broad | ruler | Δ broad | Δ ruler | KV MiB | KV % FullKV | gap broad | gap ruler "
        "| KL broad | KL gap broad |"
    )
    r = row(v2, "proportional-B64")
    cells = next(l for l in lines if l.startswith("| proportional-B64 |")).replace("**", "").split(" | ")
    iv = r.suite_iv["broad"]
    assert cells[2] == f"{r.suites['broad']:.1f}±{iv.half_width:.1f}" + cmp.tables.mark(r, "broad")
    d = r.diff["broad"]
    assert cells[4] == f"{d.estimate:+.1f}±{d.half_width:.1f}" + cmp.tables.mark(r, "broad")
    g = r.gap_iv["broad"].interval
    assert cells[8] == f"{100 * r.gap['broad']:.0f}% [{100 * g.low:.0f}, {100 * g.high:.0f}]"
    kl = r.kl["broad"]
    assert cells[10] == f"{kl.estimate:.3f}±{kl.half_width:.3f}"
    assert next(l for l in lines if l.startswith("| uniform-snapkv |")).split(" | ")[4] == "ref"
    assert "KL" not in cmp.to_markdown(cmp.compare([cmp.load_results(V1)], resamples=200)).splitlines()[0]


@pytest.mark.parametrize("which", ["v1", "v2"])
def test_default_terminal_table_fits_80_columns_without_cutting_a_cell(which, request):
    c = request.getfixturevalue(which)
    console = Console(width=80, record=True, color_system=None)
    console.print(cmp.to_rich(c))
    shown = console.export_text()
    assert "…" not in shown
    assert max(len(line) for line in shown.splitlines()) <= 80
    cols = cmp.columns(c, details=False, budget=False)
    for r in c.rows:
        for col in cols:
            if col.kind != "name":
                assert cmp.tables.text(c, r, col, details=False) in shown
    assert [col.header for col in cols] == ["entry", "broad", "ruler", "KV % FullKV", "gap broad", "gap ruler"]


def test_details_add_differences_kl_and_gap_intervals_to_the_terminal_table(v2):
    console = Console(width=250, record=True, color_system=None)
    console.print(cmp.to_rich(v2, details=True, tasks=True))
    shown = console.export_text()
    for header in ("Δ", "KL gap", "niah_single", "MiB"):
        assert header in shown
    assert cmp.tables.text(v2, row(v2, "ilp-B64"), cmp.Column("klgap:broad", "", "high"), details=True) in shown


def test_details_and_tasks_in_80_columns_split_into_tables_that_each_fit_with_every_cell_whole(v2):
    pages = cmp.to_rich_pages(v2, 80, details=True, tasks=True)
    assert len(pages) > 1
    console = Console(width=80, record=True, color_system=None)
    for page in pages:
        console.print(page)
    shown = console.export_text()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 80
    cols = [col for col in cmp.columns(v2, tasks=True, details=True, budget=False) if col.kind != "name"]
    for r in v2.rows:
        assert shown.count(r.name) == len(pages)  # the entry column on every table
        for col in cols:
            assert cmp.tables.text(v2, r, col, details=True) in shown
    assert len(cmp.to_rich_pages(v2, 250, details=True, tasks=True)) == 1


def test_summary_table_for_the_score_command_fits_80_columns_and_says_what_pm_means():
    console = Console(width=80, record=True, color_system=None)
    console.print(cmp.summary_table(cmp.load_results(V2), resamples=500))
    shown = console.export_text()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 80
    assert "proportional-B64" in shown and "paired bootstrap interval" in shown and "best uniform at B=64" in shown


def test_unresolved_lists_every_difference_whose_interval_contains_zero(v2):
    lines = cmp.unresolved(v2)
    expected = [(r.name, s) for r in v2.rows for s, d in r.diff.items() if d is not None and not d.excludes_zero]
    assert len(lines) == len(expected) > 0
    for (name, suite), line in zip(expected, lines):
        assert line.startswith(f"{name} vs uniform-snapkv on {suite} (B=64): ") and line.endswith(", not resolved")


# ---------------------------------------------------------------------------------------- JSON
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


# --------------------------------------------------------------------------------------- plots
def _is_png(path) -> bool:
    data = Path(path).read_bytes()
    return len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_error_bars_from_the_intervals(v2, tmp_path):
    err = _yerr(v2.rows, "broad")
    for r, (below, above) in zip(v2.rows, err):
        iv = r.suite_iv["broad"]
        assert (below, above) == pytest.approx((r.suites["broad"] - iv.low, iv.high - r.suites["broad"]))
    cmp.plot(v2, tmp_path / "one.png")
    assert _is_png(tmp_path / "one.png")


def test_plot_across_budgets_with_error_bars_via_cli(tmp_path, capsys):
    docs = []
    for budget in (64, 128):
        doc = json.loads(V2.read_text())
        doc["provenance"]["settings"]["budget"] = budget
        for e in doc["entries"]:
            if e["global_budget"] is not None:
                e["global_budget"] = float(budget)
        docs.append(write(tmp_path, f"r{budget}.json", doc))
    assert (
        main(["compare", *docs, "--across-budgets", "--plot", str(tmp_path / "sweep.png"), "--resamples", "300"]) == 0
    )
    assert _is_png(tmp_path / "sweep.png")
    out = capsys.readouterr().out
    assert "proportional-B64" in out and "±" in out


def test_a_narrow_terminal_folds_long_names_and_never_cuts_numbers(v1):
    console = Console(width=62, record=True, color_system=None)
    console.print(cmp.to_rich(v1))
    shown = console.export_text()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 62
    assert "uniform-stream" in shown and "ing_llm" in shown  # folded onto a second line
    for r in v1.rows:
        assert cmp.tables.text(v1, r, cmp.Column("suite:ruler", "", "high"), details=False) in shown


def test_cli_details_print_every_column_and_bad_settings_are_refused(capsys):
    assert main(["compare", str(V2), "--details", "--resamples", "300"]) == 0
    shown = capsys.readouterr().out
    assert "…" not in shown and "uniform-streaming_llm" in shown and "KL gap" in shown and "MiB" in shown
    assert main(["compare", str(V2), "--resamples", "300"]) == 0
    captured = capsys.readouterr()
    assert "KL" not in captured.out and "--details: differences to the best uniform, KL" in captured.err
    for bad in (["--resamples", "0"], ["--seed", "-1"]):
        assert main(["compare", str(V2), *bad]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_unresolved_warning_is_one_line_naming_the_first_few(v2):
    line = cmp.unresolved_warning(v2)
    n_open, n_all = len(cmp.unresolved(v2)), sum(d is not None for r in v2.rows for d in r.diff.values())
    assert "\n" not in line and line.startswith(f"{n_open} of {n_all} differences to the best uniform are not resolved")
    assert line.endswith(", …")
    doc = json.loads(V1.read_text())
    doc["entries"] = [e for e in doc["entries"] if e["name"] in ("full", "uniform-streaming_llm", "uniform-snapkv")]
    c = cmp.compare([doc], resamples=300)
    assert cmp.unresolved_warning(c) is None  # streaming_llm is clearly worse on both suites


@pytest.mark.parametrize("value", ["high", None, float("nan"), float("inf")])
def test_a_score_that_is_not_a_finite_number_is_refused_naming_the_entry(value, tmp_path):
    doc = json.loads(V1.read_text())
    doc["entries"][2]["suites"]["ruler"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))  # NaN / Infinity are written as JSON's non-standard constants
    with pytest.raises(cmp.CompareError, match=r"entries\[2\] \(uniform-h2o\) suites.ruler must be a finite number"):
        cmp.load_results(path)


def test_the_description_is_a_line_of_its_own_not_wrapped_to_a_narrow_tables_width():
    """A two-column table is ~40 columns wide; its description still uses the terminal's 80."""
    doc = cmp.load_results(V2)
    doc = {**doc, "entries": [e for e in doc["entries"] if e["name"] in ("uniform-tova", "ilp-B64")]}
    c = cmp.compare([doc], resamples=200)
    console = Console(width=80, record=True, color_system=None)
    console.print(cmp.summary_table(c))
    first = console.export_text().splitlines()[0]
    assert first.startswith("compare — ") and len(first.rstrip()) > 60
    assert first.rstrip() == cmp.describe(c)[: len(first.rstrip())]
