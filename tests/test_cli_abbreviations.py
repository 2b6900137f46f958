"""No command line takes an abbreviated flag: argparse's default ``allow_abbrev=True`` would run ``--smok`` as
``--smoke`` (or ``gpu_check.py --smok`` as its full 500-second check) and let a later flag silently change
what an abbreviation means. Every parser the CLI, the benchmarks, the scripts and the studies build refuses
one: exit code 2, one line, nothing written."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from polykv_search.cli import COMMANDS, build_parser
from tests.bad_inputs_support import (
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    run_case,
    time_limit,  # noqa: F401  (autouse: a hang fails the test)
)

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("polykv_search", "signals", "solvers", "strategies", "benchmarks", "scripts", "studies")


@pytest.mark.parametrize(
    "argv,flag",
    [
        ("solve --budget 64 --num-lay 4 --method uniform --out o.json", "--num-lay"),  # --num-layers
        ("export s.json --format json --out o.json --approx", "--approx"),  # --approximate
        ("score --baseline full --cont 64 --out o.json", "--cont"),  # --context-len
        ("collect --continuation 8 --out o.json", "--continuation"),  # --continuation-len
    ],
    ids=["solve", "export", "score", "collect"],
)
def test_an_abbreviated_flag_is_refused_in_one_line(argv, flag, tmp_path, monkeypatch, capsys):
    run_case(argv, f"unrecognized arguments: {flag}", {"s.json": "strategy"}, tmp_path, monkeypatch, capsys)


def test_the_top_level_refuses_an_abbreviated_version_flag(capsys):
    from polykv_search.cli import main

    assert main(["--vers"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--vers" in err, err


def test_every_command_parser_refuses_abbreviations():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps its sub-commands here
    assert set(commands) == set(COMMANDS)
    assert not parser.allow_abbrev and not any(p.allow_abbrev for p in commands.values())


def _parser_calls(path: Path) -> list[ast.Call]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name == "ArgumentParser":
                calls.append(node)
    return calls


def _refuses_abbreviations(call: ast.Call) -> bool:
    return any(
        k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False for k in call.keywords
    )


def test_every_argument_parser_in_the_repository_refuses_abbreviations():
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    calls = [(p, c) for p in files for c in _parser_calls(p)]
    assert len(calls) >= 15  # the benchmarks', scripts' and studies' parsers are found
    loose = [f"{p.relative_to(ROOT)}:{c.lineno}" for p, c in calls if not _refuses_abbreviations(c)]
    assert not loose, f"argparse.ArgumentParser without allow_abbrev=False: {loose}"


def test_the_static_check_sees_a_parser_that_takes_abbreviations(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import argparse\nap = argparse.ArgumentParser(description='x')\n")
    assert [_refuses_abbreviations(c) for c in _parser_calls(script)] == [False]
    script.write_text("from argparse import ArgumentParser\nap = ArgumentParser(allow_abbrev=False)\n")
    assert [_refuses_abbreviations(c) for c in _parser_calls(script)] == [True]
