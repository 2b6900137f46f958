"""quickstart end to end on SmolLM2 in a reduced configuration (slow)."""

from __future__ import annotations

import json

import pytest

from polykv_search.cli import main

pytestmark = pytest.mark.slow

REDUCED = [
    "--calib-samples",
    "2",
    "--context-len",
    "320",
    "--continuation-len",
    "16",
    "--patterns",
    "snapkv,streaming_llm",
    "--budgets",
    "32,64",
    "--budget",
    "32",
    "--eval-samples",
    "3",
    "--suite",
    "ruler/niah_single,broad/continuation",
    "--methods",
    "proportional,ilp,pyramid",
    "--head-cells",
    "32,64",
    "--head-patterns",
    "streaming_llm",
]


def test_quickstart_writes_every_artifact_and_reuses_finished_work(tmp_path):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), *REDUCED]) == 0
    for name in ("signals.json", "signals-heads.json", "results-B32.json", "compare.json", "compare.png", "report.md"):
        assert (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in (out / "strategies").iterdir()) == [
        "ilp-B32.json",
        "ilp-head-B32.json",
        "proportional-B32.json",
        "pyramid-B32.json",
    ]
    results = json.loads((out / "results-B32.json").read_text())
    names = {e["name"] for e in results["entries"]}
    assert {"full", "uniform-h2o", "uniform-kvzip[allocation=model]", "proportional-B32", "ilp-head-B32"} <= names
    report = (out / "report.md").read_text()
    assert "3 samples per task" in report and "±" in report and "paired bootstrap" in report
    assert "Head level:" in report and "`signals-heads.json`" in report
    assert "resolved" in report  # says which differences to the best uniform are (not) resolved
    verdict = report.split("\n\n")[1].splitlines()  # after the title: at most three lines, then the table
    assert 1 <= len(verdict) <= 3 and report.split("\n\n")[2].startswith("| entry |")
    stamp = (out / "results-B32.json").stat().st_mtime_ns
    assert main(["quickstart", "--out", str(out), *REDUCED]) == 0  # second run reuses the results
    assert (out / "results-B32.json").stat().st_mtime_ns == stamp
