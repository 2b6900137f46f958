"""Dependencies point one way (README, "Architecture"; docs/design.md §3).

    strategies  <-  polykv_search core  <-  signals  <-  solvers  <-  polykv_search.cli

Every library file's imports are parsed with ``ast`` (module level, inside functions and under
``TYPE_CHECKING`` alike) and each first-party import is checked against the layer order: a module
may import its own layer and the layers below, never one above. The CLI (``polykv_search/cli/`` and
``polykv_search/__main__.py``) is the top and the only place that imports everything.

Inside functions, first-party imports are allowed only where listed in :data:`LAZY_ALLOWED` with a reason
(start-up time of the CLI, or a module that pulls in a heavy optional dependency); anything else
hidden in a function is usually a cycle waiting to be untangled.

Known exceptions are named below with the file each is waiting on. An exception that no longer
occurs fails the test too, so the lists only ever shrink: delete the entry when its file is fixed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("strategies", "polykv_search", "signals", "solvers")
LAYER_NAMES = ("strategies", "polykv_search core", "signals", "solvers", "CLI")

#: Upward imports still in the tree: (importing file, imported module) -> what it waits on. None are left;
#: the mapping stays so that a temporary exception has a named place (and the stale check keeps it honest).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

#: First-party imports inside functions of library files that are allowed: (file, module) -> reason.
LAZY_ALLOWED: dict[tuple[str, str], str] = {
    # the pattern catalog for strategies (strategies/catalog.py) imports torch on first use
    ("polykv_search/__init__.py", "polykv_search.patterns"): "CLI start-up time: torch on first use",
    # a joblib worker imports this module to unpickle its task; torch only when it loads the model
    ("polykv_search/parallel.py", "polykv_search.models"): "worker start-up time: torch on first use",
}


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository root
    line: int
    module: str  # the first-party module imported (absolute)
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """0 strategies, 1 core, 2 signals, 3 solvers, 4 CLI."""
    if module == "polykv_search.__main__" or module.startswith("polykv_search.cli"):
        return 4
    return PACKAGES.index(module.split(".")[0])


def library_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def imports_of(path: Path) -> list[Import]:
    """Every first-party import in ``path``; relative imports are resolved to absolute names."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - (child.level - 1)] if child.level else []
                if child.module:
                    names = [".".join(base + [child.module])]
                else:  # `from . import table`: the names are modules of that package
                    names = [".".join(base + [alias.name]) for alias in child.names]
            for name in names:
                if name.split(".")[0] in PACKAGES:
                    found.append(Import(str(path.relative_to(ROOT)), child.lineno, name, in_function))
            visit(child, inside)

    visit(tree, False)
    return found


def all_imports() -> list[Import]:
    return [imp for path in library_files() for imp in imports_of(path)]


def is_library(file: str) -> bool:
    return layer_of(module_name(ROOT / file)) < 4


def test_the_parser_sees_imports_everywhere(tmp_path, monkeypatch):
    """Module level, inside functions, under TYPE_CHECKING, relative: all found and resolved."""
    pkg = tmp_path / "signals"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    src = pkg / "mod.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "import solvers.base\n"
        "from . import table\n"
        "if TYPE_CHECKING:\n"
        "    from polykv_search.cli import main\n"
        "def f():\n"
        "    from .replay import x\n"
        "    import numpy\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    got = [(i.module, i.in_function) for i in imports_of(src)]
    assert got == [
        ("solvers.base", False),
        ("signals.table", False),
        ("polykv_search.cli", False),
        ("signals.replay", True),
    ]
    assert [layer_of(m) for m, _ in got] == [3, 2, 4, 2]


def test_no_layer_imports_a_higher_one():
    upward = {}
    for imp in all_imports():
        if layer_of(imp.module) > layer_of(module_name(ROOT / imp.file)):
            upward.setdefault((imp.file, imp.module), imp)
    new = {k: v for k, v in upward.items() if k not in KNOWN_UPWARD}
    lines = [
        f"{i.file}:{i.line} ({LAYER_NAMES[layer_of(module_name(ROOT / i.file))]}) imports {i.module} "
        f"({LAYER_NAMES[layer_of(i.module)]})"
        for i in new.values()
    ]
    assert not lines, "lower layers import higher ones:\n" + "\n".join(lines)
    stale = sorted(set(KNOWN_UPWARD) - set(upward))
    assert not stale, f"known exceptions that no longer occur (delete them from KNOWN_UPWARD): {stale}"


def test_no_cycles_between_layers():
    """With the known exceptions taken out, the layer graph has no cycle (it points down only)."""
    edges = set()
    for imp in all_imports():
        a, b = layer_of(module_name(ROOT / imp.file)), layer_of(imp.module)
        if a != b and (imp.file, imp.module) not in KNOWN_UPWARD:
            edges.add((a, b))
    assert all(a > b for a, b in edges), sorted(edges)


def test_function_level_first_party_imports_are_listed_with_a_reason():
    seen = [i for i in all_imports() if i.in_function and is_library(i.file)]
    new = [
        f"{i.file}:{i.line} imports {i.module} inside a function"
        for i in seen
        if (i.file, i.module) not in LAZY_ALLOWED
    ]
    assert not new, (
        "first-party imports inside functions: import at module level (if that makes a cycle, the code is "
        "in the wrong layer or module); lazy only for heavy optional dependencies or CLI start-up time, "
        "listed in LAZY_ALLOWED with the reason:\n" + "\n".join(new)
    )
    stale = sorted(set(LAZY_ALLOWED) - {(i.file, i.module) for i in seen})
    assert not stale, f"exceptions that no longer occur (delete them from LAZY_ALLOWED): {stale}"


def test_strategies_imports_nothing_above_itself_at_run_time():
    """The bottom layer also works as a leaf: importing it loads no other first-party package."""
    code = (
        "import sys, strategies, strategies.exporters, strategies.io, strategies.catalog;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'polykv_search', 'signals', 'solvers'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
