"""`benchmarks/reproduce.py --head-level`: issue 25's head-level entries beside the layer-level ones
(planned only: no model is loaded here; every planned command is parsed by the real CLI parser)."""

from __future__ import annotations

import pytest

from polykv_search.cli import build_parser

HEAD_ENTRIES = ("duo", "headkv", "ilp-head", "ilp-head-streaming")


def planned(reproduce, tmp_path, *extra: str):
    args = reproduce.parse_args(["--out", str(tmp_path), "--budgets", "128,256", "--context-len", "1024", *extra])
    return reproduce.plan(args, default="h2o")


def test_head_level_collects_a_head_table_then_solves_and_scores_the_four_entries_at_every_budget(reproduce, tmp_path):
    steps = planned(reproduce, tmp_path, "--head-level")
    names = [s.name for s in steps]
    assert names[:2] == ["collect", "collect heads"]  # before any solve
    collect = steps[1].argv
    assert collect[collect.index("--out") + 1] == str(tmp_path / "signals-heads.json")
    assert collect[collect.index("--head-cells") + 1] == "64,128,256"
    assert collect[collect.index("--head-patterns") + 1] == "streaming_llm,snapkv,h2o"
    assert "--retrieval-heads" in collect
    for B in ("128", "256"):
        solves = {s.target.stem: s.argv for s in steps if s.argv[0] == "solve"}
        (score,) = [s for s in steps if s.name == f"score B={B}"]
        scored = score.argv[score.argv.index("--strategy") + 1 : score.argv.index("--out")]
        for entry in HEAD_ENTRIES:
            argv = solves[f"{entry}-B{B}"]
            assert argv[argv.index("--signals") + 1] == str(tmp_path / "signals-heads.json")
            assert argv[argv.index("--target-context-len") + 1] == "1024"  # a keep-all head keeps the context
            assert str(tmp_path / "strategies" / f"{entry}-B{B}.json") in scored
    ilp = solves["ilp-head-streaming-B256"]
    assert ilp[ilp.index("--granularity") + 1] == "head" and ilp[ilp.index("--head-patterns") + 1] == "streaming_llm"
    assert "--head-patterns" not in solves["ilp-head-B256"]  # the combined one chooses among all three


def test_head_patterns_name_the_head_tables_cells(reproduce, tmp_path):
    pooled = "streaming_llm,snapkv,h2o,kvzip[allocation=model]"
    collect = planned(reproduce, tmp_path, "--head-level", "--head-patterns", pooled)[1].argv
    assert collect[collect.index("--head-patterns") + 1] == pooled


def test_without_the_flag_nothing_head_level_is_planned(reproduce, tmp_path):
    steps = planned(reproduce, tmp_path)
    assert "collect heads" not in [s.name for s in steps]
    assert not any(s.target and s.target.stem.startswith(HEAD_ENTRIES) for s in steps if s.argv[0] == "solve")


@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--head-level", "--question-aware", "--head-grid", "32,64"),
        ("--head-level", "--head-patterns", "streaming_llm,snapkv,h2o,kvzip[allocation=model]"),
    ],
)
def test_every_planned_command_is_one_the_cli_accepts(reproduce, tmp_path, extra):
    parser = build_parser()
    for step in planned(reproduce, tmp_path, *extra):
        args, unknown = parser.parse_known_args(step.argv)
        assert unknown == [], (step.name, unknown)


def test_head_level_with_one_calibration_sample_is_refused_before_any_step(reproduce, tmp_path, capsys):
    """Its retrieval scores need two evidence samples: one line and exit 2 at parse time, not a failure
    after the layer-level collect has run."""
    with pytest.raises(SystemExit) as exit_:
        reproduce.parse_args(["--out", str(tmp_path), "--head-level", "--calib-samples", "1"])
    assert exit_.value.code == 2
    assert "--head-level needs --calib-samples of at least 2" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
