"""`show` and `solve --list-methods` read in an 80-column terminal: no line wider than 80, nothing cut
off with an ellipsis, every pattern name, head group and setting printed whole (wrapped when it must)."""

from __future__ import annotations

import pytest

from polykv_search.cli import common, main
from signals import random_signal_table
from strategies import HeadGroup, LayerChoice, Strategy

WIDE = ("snapkv", "expected_attention", "streaming_llm", "keydiff")


@pytest.fixture
def terminal_80(monkeypatch):
    monkeypatch.setattr(common.out, "width", 80)


def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_a_signal_table_with_long_pattern_names_fits_80_columns(tmp_path, capsys, terminal_80):
    table = random_signal_table(num_layers=6, patterns=WIDE, samples=3, seed=1)
    assert main(["show", str(table.save(tmp_path / "t.json"))]) == 0
    lines = _lines(capsys)
    assert max(len(line) for line in lines) <= 80
    assert not any("…" in line for line in lines)
    header = next(line for line in lines if line.lstrip().startswith("layer"))
    for column in ("entropy", "var", "best (KL/dPPL/cos)", "KL", "dPPL", "cos", "worst", "≈Full"):
        assert column in header
    text = " ".join(" ".join(lines).split())
    assert "worst: the layer's worst dPPL over patterns at budget 32" in text
    for phase in table.phases:  # every layer's row is there
        assert f"{phase}: best pattern per layer by KL/dPPL/cos" in text


def test_the_best_patterns_are_named_once_when_the_metrics_agree():
    from polykv_search.cli.show_signals import _best_names

    row = {"best_kl": ("tova", 0.1), "best_dppl": ("tova", 0.2), "best_cosine": ("tova", 0.9)}
    assert _best_names(row, ["best_kl", "best_dppl", "best_cosine"]) == "tova"
    row["best_dppl"] = ("expected_attention", 0.2)
    assert _best_names(row, ["best_kl", "best_dppl", "best_cosine"]) == "tova / expected_attention / tova"


def _three_group_layer(budget: int) -> LayerChoice:
    return LayerChoice.grouped(
        [
            HeadGroup((0,), "expected_attention", budget, {}),
            HeadGroup((1,), "streaming_llm", 2 * budget, {"n_sink": 4}),
            HeadGroup((2,), "full", 1024, {}),
        ]
    )


def test_a_head_group_strategy_prints_one_group_per_line_in_one_column_pair(tmp_path, capsys, terminal_80):
    layers = [_three_group_layer(64 + 64 * i) for i in range(4)]
    strategy = Strategy(layers, list(layers), 700, 1, {"solver": "test"}, context_len=1024, num_kv_heads=3)
    assert main(["show", str(strategy.save(tmp_path / "s.json"))]) == 0
    lines = _lines(capsys)
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    assert any("pattern (both phases)" in line for line in lines)  # decoding repeats prefill: one pair
    for i in range(4):
        b = 64 + 64 * i
        for label in (f"expected_attention@{b}[0]", f"streaming_llm@{2 * b}[1]", "full@1024[2]"):
            assert sum(label in line for line in lines) >= 1


def test_a_strategy_whose_phases_differ_keeps_a_column_pair_per_phase(tmp_path, capsys, terminal_80):
    strategy = Strategy(
        [LayerChoice("snapkv", 64)] * 3, [LayerChoice("expected_attention", 128)] * 3, 128, 1, {"solver": "test"}
    )
    assert main(["show", str(strategy.save(tmp_path / "s.json"))]) == 0
    lines = _lines(capsys)
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    text = " ".join(" ".join(lines).split())
    assert "prefill pattern" in text and "both phases" not in text
    assert sum("expected_attention" in line for line in lines) == 3


def test_the_solver_list_prints_every_setting_whole_in_80_columns(capsys, terminal_80):
    from solvers import get_solver_class, list_methods

    assert main(["solve", "--list-methods"]) == 0
    lines = _lines(capsys)
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    flags = {line.split("│")[4].strip() for line in lines if line.count("│") == 5}
    for m in list_methods():
        if m.available:
            for info in get_solver_class(m.name).Settings.fields_info():
                assert f"{info.flag}={info.default}" in flags
