"""scripts/verify_kvpress_patterns.py without kvpress: its budgets, its comparison and its errors
(the run against the real kvpress needs a virtualenv and SmolLM2; its figures are in the report)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from polykv_search.patterns import PATTERNS

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "verify_kvpress_patterns.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("verify_kvpress_patterns", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_budget_is_kvpress_compute_n_kept(script):
    # kvpress: max(1, int(k_len * (1 - compression_ratio)))
    assert [script.budget_for(512, r) for r in (0.1, 0.25, 0.5, 0.75, 0.9, 0.97)] == [460, 384, 256, 128, 51, 15]
    assert script.budget_for(10, 0.99) == 1


def test_every_mapped_pattern_is_registered(script):
    assert set(script.PRESSES) <= set(PATTERNS)
    assert {p.kept for p in script.PRESSES.values()} <= {"cache", "masked"}


def test_compare_counts_identical_heads_and_near_ties(script):
    # one prompt, one layer, two heads of 6 tokens, budget 3 (ratio 0.5)
    mine = {"0.5": [[[[0, 1, 2], [0, 3, 4]]]]}  # [prompt][layer][head] kept positions
    scores = [[[5.0, 4.0, 3.0, 1.0, 0.0, -1.0], [9.0, 1.0, 1.0 + 1e-9, 2.0, 0.5, 0.0]]]
    theirs = {"0.5": [{"kept": [[[0, 1, 2], [0, 2, 3]]], "scores": scores, "inexact": 0}]}
    (row,) = script.compare(mine, theirs, 6, tie_tol=1e-4)
    assert (row["budget"], row["heads"], row["identical"], row["differing"]) == (3, 2, 1, 1)
    assert row["swapped_max"] == 1 and row["near_ties"] == 0  # token 4 (0.5) is far from the cut (1.0)
    theirs["0.5"][0]["scores"][0][1] = [9.0, 1.0, 1.0 + 1e-9, 2.0, 1.0, 0.0]  # now 2 and 4 tie with the cut
    (row,) = script.compare(mine, theirs, 6, tie_tol=1e-4)
    assert row["near_ties"] == 1 and row["max_cutoff_gap"] < 1e-4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "x", "--patterns", "snapkv"], "unknown pattern"),
        (["--model", "x", "--ratios", "0.5,1.0"], "every ratio"),
        (["--model", "x", "--ratios", "half"], "comma-separated numbers"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(script, argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        script.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
