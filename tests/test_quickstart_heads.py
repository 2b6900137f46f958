"""quickstart's head-level entry: the steps it plans (no model is loaded: `invoke` is faked)."""

from __future__ import annotations

import pytest

from polykv_search.cli import build_parser


class Stop(Exception):
    """Raised by the fake `invoke` at the score step: nothing after it runs."""


def planned(tmp_path, monkeypatch, *extra: str) -> list[list[str]]:
    """Every command quickstart runs up to and including `score`, in order."""
    import polykv_search.cli as cli

    args = build_parser().parse_args(["quickstart", "--out", str(tmp_path / "qs"), *extra])
    calls = []

    def fake_invoke(argv, parser=None):
        calls.append(argv)
        if argv[0] == "score":
            raise Stop

    monkeypatch.setattr(cli, "invoke", fake_invoke)
    with pytest.raises(Stop):
        args.func(args)
    return calls


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_by_default_a_head_table_is_collected_and_the_head_level_ilp_is_scored(tmp_path, monkeypatch):
    calls = planned(tmp_path, monkeypatch)
    collects = [c for c in calls if c[0] == "collect"]
    tables = [str(tmp_path / "qs" / name) for name in ("signals-heads.json", "signals.json")]
    assert [value(c, "--out") for c in collects] == tables
    heads = collects[0]  # first: a calibration too short for its evidence samples fails before the long collect
    assert value(heads, "--retrieval-heads") == "2" and value(heads, "--samples") == "2"  # the calibration split
    assert value(heads, "--head-cells") == "32,64,128"
    assert value(heads, "--head-patterns") == "streaming_llm,h2o,kvzip[allocation=model]"  # KVzip's pool (H24)
    assert value(heads, "--context-len") == value(collects[1], "--context-len") == "512"
    (solve,) = [c for c in calls if c[0] == "solve" and "--granularity" in c]
    assert value(solve, "--method") == "ilp" and value(solve, "--granularity") == "head"
    assert value(solve, "--signals") == str(tmp_path / "qs" / "signals-heads.json")
    assert value(solve, "--budget") == "128" and value(solve, "--target-context-len") == "512"
    target = str(tmp_path / "qs" / "strategies" / "ilp-head-B128.json")
    assert value(solve, "--out") == target and target in calls[-1]  # scored beside the layer-level strategies


def test_the_head_level_ilp_is_built_for_the_evaluation_context(tmp_path, monkeypatch):
    calls = planned(tmp_path, monkeypatch, "--eval-context-len", "1024", "--head-cells", "64", "--head-patterns", "h2o")
    (solve,) = [c for c in calls if c[0] == "solve" and "--granularity" in c]
    assert value(solve, "--target-context-len") == "1024"  # a kept-whole head holds the evaluation prompt
    (heads,) = [c for c in calls if c[0] == "collect" and "--head-cells" in c]
    assert value(heads, "--head-cells") == "64" and value(heads, "--head-patterns") == "h2o"


def test_no_head_level_runs_what_it_ran_before(tmp_path, monkeypatch):
    calls = planned(tmp_path, monkeypatch, "--no-head-level", "--calib-samples", "1")
    assert not any("--head-cells" in c or "--granularity" in c for c in calls)
    assert not any("ilp-head" in arg for arg in calls[-1])


def test_head_patterns_take_specs_whose_brackets_hold_commas(tmp_path, monkeypatch):
    calls = planned(tmp_path, monkeypatch, "--head-patterns", "h2o,kvzip[allocation=model,n_sink=8]")
    (heads,) = [c for c in calls if c[0] == "collect" and "--head-cells" in c]
    assert value(heads, "--head-patterns") == "h2o,kvzip[allocation=model,n_sink=8]"


def test_the_best_uniform_on_ruler_is_among_the_default_baselines(tmp_path, monkeypatch):
    score = planned(tmp_path, monkeypatch)[-1]
    baselines = [score[i + 1] for i, arg in enumerate(score) if arg == "--baseline"]
    assert baselines == ["full", "uniform:h2o", "uniform:kvzip[allocation=model]"]  # --full: the 2023-24 ones too


def test_baselines_can_be_chosen(tmp_path, monkeypatch):
    score = planned(tmp_path, monkeypatch, "--baselines", "full,uniform:kvzip[allocation=model,n_sink=8]")[-1]
    baselines = [score[i + 1] for i, arg in enumerate(score) if arg == "--baseline"]
    assert baselines == ["full", "uniform:kvzip[allocation=model,n_sink=8]"]


@pytest.mark.parametrize(
    ("spec", "named"),
    [("uniform:nope", "nope"), ("uniform:kvzip[allocation=disk]", "disk"), ("median", "median")],
)
def test_a_bad_baseline_is_refused_before_any_step_runs(tmp_path, monkeypatch, spec, named):
    import polykv_search.cli as cli
    from polykv_search.cli.common import CLIError

    args = build_parser().parse_args(["quickstart", "--out", str(tmp_path / "qs"), "--baselines", f"full,{spec}"])
    monkeypatch.setattr(cli, "invoke", lambda argv, parser=None: pytest.fail(f"ran {argv[0]}"))
    with pytest.raises(CLIError) as err:
        args.func(args)
    assert "\n" not in str(err.value) and str(err.value).startswith("--baselines: ") and named in str(err.value)
    assert not (tmp_path / "qs").exists()


def test_score_results_are_reused_only_when_they_hold_every_strategy_and_baseline(tmp_path):
    import json

    from polykv_search.cli.quickstart import _results_match

    settings = {"suite": "ruler", "samples": 9, "context_len": 512, "budget": 128}
    path = tmp_path / "results.json"
    entries = [{"source": s} for s in ("a.json", "full", "uniform:tova")]
    path.write_text(json.dumps({"provenance": {"settings": settings}, "entries": entries}))
    assert _results_match(path, settings, ["a.json", "full", "uniform:tova"])
    assert not _results_match(path, settings, ["a.json", "full", "uniform:kvzip[allocation=model]"])
    assert not _results_match(path, settings, ["b.json", "full"])
    assert not _results_match(path, {**settings, "samples": 10}, ["a.json"])
    assert _results_match(path, {**settings, "samples": 7}, ["a.json"])  # more samples per task (--full's 9) serve
    assert not _results_match(path, {**settings, "context_len": 1024}, ["a.json"])


def test_a_rerun_scores_again_when_the_results_lack_a_default_baseline(tmp_path, monkeypatch):
    import json

    import polykv_search.cli as cli
    from polykv_search.cli.quickstart_defaults import BASELINES, METHODS
    from polykv_search.patterns import split_specs

    out = tmp_path / "qs"
    strategies = [str(out / "strategies" / f"{m}-B128.json") for m in (*METHODS, "ilp-head")]
    settings = {"suite": "broad,ruler", "samples": 9, "context_len": 512, "budget": 128}

    def commands(baselines: list[str]) -> list[str]:
        out.mkdir(exist_ok=True)
        entries = [{"source": s} for s in strategies + baselines]
        (out / "results-B128.json").write_text(json.dumps({"provenance": {"settings": settings}, "entries": entries}))
        ran = []

        def fake_invoke(argv, parser=None):
            ran.append(argv[0])
            if argv[0] in ("score", "compare"):
                raise Stop

        monkeypatch.setattr(cli, "invoke", fake_invoke)
        args = build_parser().parse_args(["quickstart", "--out", str(out)])
        with pytest.raises(Stop):
            args.func(args)
        return ran

    everything = split_specs(BASELINES)
    assert commands(everything)[-1] == "compare"  # every entry is there: the results are reused
    assert commands(everything[:-1])[-1] == "score"  # uniform:kvzip[allocation=model] is missing: scored again
