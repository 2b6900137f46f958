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


@pytest.fixture(scope="module")
def kept(script):
    """scripts/kvpress_kept.py, the script's comparison helpers (importable once the script is loaded)."""
    import kvpress_kept

    return kvpress_kept


def test_budget_is_kvpress_compute_n_kept(kept):
    # kvpress: max(1, int(k_len * (1 - compression_ratio)))
    assert [kept.budget_for(512, r) for r in (0.1, 0.25, 0.5, 0.75, 0.9, 0.97)] == [460, 384, 256, 128, 51, 15]
    assert kept.budget_for(10, 0.99) == 1


@pytest.mark.parametrize("n", [512, 523, 590, 611, 677])
@pytest.mark.parametrize("ratio", [0.5, 0.75, 0.875, 0.9])
def test_pooled_budgets_hold_kvzippress_count_at_any_length(kept, n, ratio):
    """KVzipPress drops int(Hkv*n*r) tokens per layer (layerwise) or int(L*Hkv*n*r) over the model; pools of
    per-head budgets hold exactly what it keeps, each head within one token of the others."""
    layers, heads = 30, 3
    by_layer = kept.pool_budgets(n, ratio, layers, heads, "layer")
    assert [sum(row) for row in by_layer] == [heads * n - int(heads * n * ratio)] * layers
    by_model = kept.pool_budgets(n, ratio, layers, heads, "model")
    assert sum(map(sum, by_model)) == layers * heads * n - int(layers * heads * n * ratio)
    for budgets in (by_layer, by_model):
        assert len(budgets) == layers and {len(row) for row in budgets} == {heads}
        assert max(map(max, budgets)) - min(map(min, budgets)) <= 1


def test_the_issues_count_gap_is_closed(kept):
    # 611 tokens at ratio 0.5: kvpress keeps 90*611 - int(90*611*0.5) = 27495; 90 heads of int(305.5) keep 27450
    assert kept.kvpress_pool_kept(611, 0.5, 30, 3, layerwise=False) == [27495]
    assert 90 * kept.budget_for(611, 0.5) == 27450
    assert sum(map(sum, kept.pool_budgets(611, 0.5, 30, 3, "model"))) == 27495


@pytest.mark.parametrize("allocation", ["layer", "model"])
def test_a_pooled_checks_strategy_makes_the_runtime_hold_kvpress_count(script, kept, allocation):
    import torch

    from polykv_search.runtime import apply_strategy
    from tests.tiny import tiny_model

    model, n, ratio = tiny_model("llama", layers=3), 61, 0.875
    strategy = script.strategy_for("kvzip", {"allocation": allocation}, n, ratio, 3, 2)
    ids = torch.randint(10, 100, (1, n), generator=torch.Generator().manual_seed(0))
    with apply_strategy(model, strategy) as rt, torch.no_grad():
        model(ids, use_cache=True)
        held = [[len(h) for h in script.held_positions(layer)] for layer in rt.last_cache.layers]
    pools = [sum(row) for row in held] if allocation == "layer" else [sum(map(sum, held))]
    assert pools == kept.kvpress_pool_kept(n, ratio, 3, 2, layerwise=allocation == "layer")
    assert script.strategy_for("kvzip", {}, n, ratio, 3, 2).prefill[0].budget == kept.budget_for(n, ratio)


def test_every_mapped_pattern_is_registered(script):
    assert {p.pattern or name for name, p in script.PRESSES.items()} <= set(PATTERNS)
    assert {p.kept for p in script.PRESSES.values()} <= {"cache", "masked"}
    for name, press in script.PRESSES.items():  # our parameters are valid for our pattern
        PATTERNS[press.pattern or name](**press.params)


def test_checks_are_picked_by_name_or_by_pattern(script):
    every_kvzip = [c for c, p in script.PRESSES.items() if (p.pattern or c) == "kvzip"]
    assert len(every_kvzip) >= 2 and script.selected_checks(["kvzip"]) == (every_kvzip, [])
    assert script.selected_checks(["kvzip-global", "keydiff"]) == (["keydiff", "kvzip-global"], [])
    assert script.selected_checks(["snapkv"]) == ([], ["snapkv"])


def test_top_b_from_scores_is_our_rule_sinks_first_ties_to_the_older_token(kept):
    # one layer, two heads of 6 tokens; n_sink 1, budget 3
    scores = [[[0.0, 0.5, 0.2, 0.5, 0.9, 0.1], [0.7, 0.1, 0.1, 0.1, 0.0, 0.3]]]
    got = kept.top_b_from_scores(scores, 3, 1)
    assert got["kept"] == [[[0, 1, 4], [0, 1, 5]]]  # head 0: the tie 1/3 goes to 1; head 1: sink + 0.3 + older 0.1
    assert got["scores"][0][0][0] == pytest.approx(1.9)  # sinks raised to the head's max + 1
    assert got["scores"][0][1][0] == pytest.approx(1.7)
    assert kept.top_b_from_scores(scores, 1, 4)["kept"] == [[[0], [0]]]  # budget below the sinks: oldest first


def test_compare_measures_overlap_when_budgets_differ_between_heads(kept):
    # a masked press: the layer keeps 6 tokens, 4 in head 0 and 2 in head 1; we keep 3 and 3
    mine = {"0.5": [[[[0, 1, 2], [0, 3, 4]]]]}
    theirs = {"0.5": [{"kept": [[[0, 1, 2, 5], [0, 3]]]}]}
    (row,) = kept.compare(mine, theirs, 6, tie_tol=1e-4)
    assert (row["identical"], row["differing"], row["near_ties"]) == (0, 2, 0)
    assert row["jaccard_differing"] == pytest.approx((3 / 4 + 2 / 3) / 2)
    assert row["layer_jaccard"] == pytest.approx(5 / 7)  # 5 (head, token) pairs in common of 7
    assert row["common_share"] == pytest.approx(5 / 6)
    assert row["kept_per_head_theirs"] == 3.0 and row["theirs_head_range"] == [2, 4]
    assert kept.kept_share(mine["0.5"], 1, 3) == 0.5  # slots 1, 2 of 2 heads: head 0 keeps both, head 1 neither


def test_compare_counts_identical_heads_and_near_ties(kept):
    # one prompt, one layer, two heads of 6 tokens, budget 3 (ratio 0.5)
    mine = {"0.5": [[[[0, 1, 2], [0, 3, 4]]]]}  # [prompt][layer][head] kept positions
    scores = [[[5.0, 4.0, 3.0, 1.0, 0.0, -1.0], [9.0, 1.0, 1.0 + 1e-9, 2.0, 0.5, 0.0]]]
    theirs = {"0.5": [{"kept": [[[0, 1, 2], [0, 2, 3]]], "scores": scores, "inexact": 0}]}
    (row,) = kept.compare(mine, theirs, 6, tie_tol=1e-4)
    assert (row["budget"], row["heads"], row["identical"], row["differing"]) == (3, 2, 1, 1)
    assert row["swapped_max"] == 1 and row["near_ties"] == 0  # token 4 (0.5) is far from the cut (1.0)
    theirs["0.5"][0]["scores"][0][1] = [9.0, 1.0, 1.0 + 1e-9, 2.0, 1.0, 0.0]  # now 2 and 4 tie with the cut
    (row,) = kept.compare(mine, theirs, 6, tie_tol=1e-4)
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
