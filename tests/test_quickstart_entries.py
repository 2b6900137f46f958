"""quickstart's entry set: the default (three solvers, FullKV and two uniforms beside the head-level ilp) and
``--full`` (every solver and the 2023-24 uniforms, the set of the runs before issue 61); the score step prints
no table, the compare step prints it once. No model is loaded (`invoke` is faked)."""

from __future__ import annotations

from tests.test_quickstart_heads import planned, value


def entries(calls: list[list[str]]) -> tuple[list[str], list[str], list[str]]:
    """(solved methods, scored strategy files' names, scored baselines) of the planned commands."""
    solves = [value(c, "--method") for c in calls if c[0] == "solve" and "--granularity" not in c]
    score = calls[-1]
    assert score[0] == "score"
    start = score.index("--strategy") + 1
    files = [arg.rsplit("/", 1)[-1] for arg in score[start:] if arg.endswith(".json")][: len(solves) + 1]
    baselines = [score[i + 1] for i, arg in enumerate(score) if arg == "--baseline"]
    return solves, files, baselines


def test_by_default_the_paper_ilp_and_pyramid_are_scored_beside_fullkv_and_two_uniforms(tmp_path, monkeypatch):
    solves, files, baselines = entries(planned(tmp_path, monkeypatch))
    assert solves == ["proportional", "ilp", "pyramid"]
    assert files == ["proportional-B128.json", "ilp-B128.json", "pyramid-B128.json", "ilp-head-B128.json"]
    # the best uniform on both suites and the lowest-KL one: the references of the report's findings
    assert baselines == ["full", "uniform:h2o", "uniform:kvzip[allocation=model]"]


def test_full_restores_every_solver_and_the_2023_24_uniforms(tmp_path, monkeypatch):
    solves, files, baselines = entries(planned(tmp_path, monkeypatch, "--full"))
    assert solves == ["proportional", "ilp", "dp", "squeeze", "cake", "pyramid", "optuna"]
    assert files[-1] == "ilp-head-B128.json" and len(files) == 8
    assert baselines == [
        "full",
        "uniform:snapkv",
        "uniform:tova",
        "uniform:h2o",
        "uniform:streaming_llm",
        "uniform:kvzip[allocation=model]",
    ]


def test_seven_samples_per_task_by_default_nine_with_full_and_a_given_count_wins(tmp_path, monkeypatch):
    assert value(planned(tmp_path / "a", monkeypatch)[-1], "--samples") == "7"
    assert value(planned(tmp_path / "b", monkeypatch, "--full")[-1], "--samples") == "9"
    assert value(planned(tmp_path / "c", monkeypatch, "--full", "--eval-samples", "4")[-1], "--samples") == "4"


def test_methods_and_baselines_given_win_over_the_default_and_over_full(tmp_path, monkeypatch):
    solves, _, baselines = entries(
        planned(tmp_path, monkeypatch, "--full", "--methods", "cake", "--baselines", "full,uniform:tova")
    )
    assert solves == ["cake"] and baselines == ["full", "uniform:tova"]
    solves, _, baselines = entries(planned(tmp_path / "b", monkeypatch, "--methods", "squeeze"))
    assert solves == ["squeeze"] and baselines == ["full", "uniform:h2o", "uniform:kvzip[allocation=model]"]


def test_the_score_step_prints_no_table_so_that_the_terminal_shows_it_once(tmp_path, monkeypatch):
    score = planned(tmp_path, monkeypatch)[-1]
    assert "--no-table" in score


def test_the_report_opens_with_at_most_three_lines_then_the_table_once_then_the_details(tmp_path):
    from pathlib import Path

    from polykv_search import compare as cmp
    from polykv_search.cli import build_parser
    from polykv_search.cli.quickstart_report import report_text
    from tests.compare_support import V2

    doc = cmp.load_results(V2)
    comparison = cmp.compare([doc], sources=[str(V2)], resamples=300)
    args = build_parser().parse_args(["quickstart", "--out", str(tmp_path / "qs")])
    text = report_text(comparison, doc, {"3/4 score": 700.0}, args, "Prose only.", Path("signals.json"))
    title, verdict, table, commands, rest = text.split("\n\n", 4)
    assert title == "# polykv-search quickstart" and 1 <= len(verdict.splitlines()) <= 3
    assert all(len(line.removesuffix("  ")) <= 80 for line in verdict.splitlines())
    assert verdict.startswith("Use proportional-B64 at B = 64") and "the command under the table" in verdict
    assert table.startswith("| entry |") and text.count("| entry |") == 1
    # the export command right under the table, in a shell block of 80 columns
    assert commands.startswith("```sh\n# proportional-B64 at B = 64, for kvpress:\npolykv-search export ")
    assert commands.endswith("```") and all(len(line) <= 80 for line in commands.splitlines())
    assert rest.startswith("## Details") and "**Recommendation at B = 64: proportional-B64" in rest
    assert "```python" in rest and rest.rstrip().endswith("score 700s")
