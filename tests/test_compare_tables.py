"""compare's tables (Markdown, the terminal at 80 columns and narrower, details, the score command's
summary) and plots, on the fixed results files of ``tests/compare_support.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from polykv_search import compare as cmp
from polykv_search.cli import main
from polykv_search.compare.plots import _yerr
from tests.compare_support import V1, V2, row, write


# --------------------------------------------------------------------------------------- tables
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


def test_a_narrow_terminal_folds_long_names_and_never_cuts_numbers(v1):
    console = Console(width=62, record=True, color_system=None)
    console.print(cmp.to_rich(v1))
    shown = console.export_text()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 62
    assert "uniform-stream" in shown and "ing_llm" in shown  # folded onto a second line
    for r in v1.rows:
        assert cmp.tables.text(v1, r, cmp.Column("suite:ruler", "", "high"), details=False) in shown


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


def test_cli_details_print_every_column_and_bad_settings_are_refused(capsys):
    assert main(["compare", str(V2), "--details", "--resamples", "300"]) == 0
    shown = capsys.readouterr().out
    assert "…" not in shown and "uniform-streaming_llm" in shown and "KL gap" in shown and "MiB" in shown
    assert main(["compare", str(V2), "--resamples", "300"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("entry"))
    assert "KL" not in lines[header - 1] + lines[header]  # the compact table has no KL columns
    assert "--details: differences to the best uniform, KL" in captured.err
    for bad in (["--resamples", "0"], ["--seed", "-1"]):
        assert main(["compare", str(V2), *bad]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_summary_table_for_the_score_command_fits_80_columns_and_says_what_pm_means():
    console = Console(width=80, record=True, color_system=None)
    console.print(cmp.summary_table(cmp.load_results(V2), resamples=500))
    shown = console.export_text()
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 80
    assert "proportional-B64" in shown and "paired bootstrap interval" in shown and "best uniform at B=64" in shown


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


def test_unresolved_warning_is_one_line_naming_the_first_few(v2):
    line = cmp.unresolved_warning(v2)
    n_open, n_all = len(cmp.unresolved(v2)), sum(d is not None for r in v2.rows for d in r.diff.values())
    assert "\n" not in line and line.startswith(f"{n_open} of {n_all} differences to the best uniform are not resolved")
    assert line.endswith(", …")
    doc = json.loads(V1.read_text())
    doc["entries"] = [e for e in doc["entries"] if e["name"] in ("full", "uniform-streaming_llm", "uniform-snapkv")]
    c = cmp.compare([doc], resamples=300)
    assert cmp.unresolved_warning(c) is None  # streaming_llm is clearly worse on both suites


# ---------------------------------------------------------------------------------------- plots
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
