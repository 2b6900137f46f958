"""The README, docs/ and studies/: every relative link and every repository path they name exists; the README
stays short, opens with its two set-up commands, and each command's `--help` names its doc page; docs/ holds
documentation, not data, and studies/ keeps its raw files compressed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polykv_search.cli import COMMANDS, DOC_PAGES, main

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "studies"
#: pages whose links and named repository paths must exist
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(STUDIES.glob("**/README.md"))]
#: the studies' notebooks and plans: their links must resolve (their commands name files runs wrote, as they ran)
NOTEBOOKS = [p for p in sorted(STUDIES.glob("**/*.md")) if p not in PAGES and p.parent.name != "quickstart"]
#: a path into the repository: a top-level folder of the project, or one of its top-level files
TOP = ("polykv_search", "signals", "solvers", "strategies", "tests", "benchmarks", "scripts", "docs", "studies")
PATH = re.compile(r"(?<![\w/.$~-])((?:" + "|".join(TOP) + r")/[\w./*-]*|README\.md|CONTRIBUTING\.md|pyproject\.toml)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SETUP = [
    "pip install torch==2.13.0 -e . && polykv-search quickstart",
    'pip install torch==2.13.0 -e ".[test]" && pytest',
]


def named_paths(text: str) -> list[str]:
    return sorted({m.group(1).rstrip(".") for m in PATH.finditer(text)})


def test_the_path_pattern_finds_repository_paths_and_skips_outputs():
    text = (
        "see `polykv_search/patterns/h2o.py`, [x](docs/results.md), tests/oracle.py::test_a, "
        "runs/study/signals.json, $D/strategies/a.json, polykv-quickstart/strategies/ilp-B128.json and README.md."
    )
    assert named_paths(text) == ["README.md", "docs/results.md", "polykv_search/patterns/h2o.py", "tests/oracle.py"]


def missing_links(page: Path, text: str) -> list[str]:
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            missing.append(f"link {target}")
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_named_path_exists(page: Path):
    text = page.read_text()
    missing = missing_links(page, text)
    for path in named_paths(text):
        if "*" in path:
            if not list(ROOT.glob(path)):
                missing.append(f"glob {path}")
        elif not (ROOT / path).exists():
            missing.append(f"path {path}")
    assert not missing, f"{page.name}: {missing}"


@pytest.mark.parametrize("page", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_a_study_notebook_exists(page: Path):
    assert not missing_links(page, page.read_text()), page.name


def test_docs_hold_documentation_and_studies_keep_their_raw_files_compressed():
    docs = [p for p in (ROOT / "docs").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in docs) < 10 * 2**20
    assert not [p.name for p in docs if p.suffix not in (".md", ".png")], "raw files belong in studies/"
    big = [str(p.relative_to(ROOT)) for p in STUDIES.rglob("*.json") if p.stat().st_size > 64_000]
    assert not big, f"compress these (.json.xz, read by every loader): {big}"
    inserts = [str(p.relative_to(ROOT)) for p in STUDIES.rglob("*.py") if "sys.path" in p.read_text()]
    assert not inserts, f"run study scripts as python -m studies.X.Y instead: {inserts}"


def test_readme_is_short_and_opens_with_the_two_setup_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 160]
    assert not long, f"README lines over 160 characters: {long}"
    first = lines.index("```bash")
    block = lines[first + 1 : lines.index("```", first + 1)]
    assert block == SETUP


OLD_NAME = "DESIGN" + ".md"  # spelled in two pieces so that this file does not cite it


def test_code_and_tests_cite_docs_design_not_a_missing_design_file():
    design = ROOT / "docs" / "design.md"
    assert design.exists()
    stale = []
    for path in ROOT.rglob("*.py"):
        if ".git" in path.parts:
            continue
        for i, line in enumerate(path.read_text().splitlines()):
            if OLD_NAME in line:
                stale.append(f"{path.relative_to(ROOT)}:{i + 1}")
    assert not stale, f"cite docs/design.md instead: {stale}"


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_help_ends_with_its_doc_page(command, capsys):
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    page = DOC_PAGES[command]
    assert f"Documentation: {page}" in " ".join(text.split())
    assert (ROOT / page).exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_help_fits_an_80_column_terminal(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main([command, "--help"]) == 0
    wide = [line for line in capsys.readouterr().out.splitlines() if len(line) > 80]
    assert not wide, wide[:3]
