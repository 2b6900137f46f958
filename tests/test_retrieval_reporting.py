"""Retrieval-aware calibration where it is reported: `show`, `quickstart --retrieval-mix` and
`benchmarks/reproduce.py --retrieval-mix` (planned, never run: no model is loaded here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_retrieval_calibration import M, N, char_tokenizer, toy_corpus

from polykv_search.cli import build_parser, main
from polykv_search.cli.quickstart import calibration_summary
from polykv_search.cli.show_signals import describe_retrieval
from polykv_search.data.evidence import describe_evidence, make_calibration_samples, parse_retrieval_mix
from signals import SignalTable, random_signal_table


def mixed_record(spec: str = "0.5", n: int = 4) -> dict:
    """The provenance record `collect --retrieval-mix` writes, from real evidence samples."""
    mix = parse_retrieval_mix(spec)
    samples = make_calibration_samples(
        char_tokenizer(), toy_corpus(), n_samples=n, context_len=N, continuation_len=M, seed=0, mix=mix
    )
    return describe_evidence(samples, mix)


def one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------ show
def test_show_prints_the_mix_of_a_mixed_table(tmp_path, capsys):
    table = random_signal_table(num_layers=2, samples=4, provenance={"retrieval": mixed_record()})
    path = table.save(tmp_path / "mixed.json")
    assert SignalTable.load(path).retrieval["evidence_samples"] == 2
    assert main(["show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "retrieval mix 0.5: 2 of 4 samples with evidence, 2 prose; 4 records each" in one_line(text)
    assert "scored on their answer tokens only" in one_line(text) and "prose only" not in text
    lines = [line for line in text.splitlines() if "retrieval mix" in line or "answer tokens" in line]
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines)


def test_show_prints_prose_only_for_an_old_table(tmp_path, capsys):
    doc = random_signal_table(num_layers=2, samples=3).to_json()
    doc["provenance"].pop("retrieval", None)  # a table collected before retrieval-aware calibration
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    assert main(["show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "retrieval mix: prose only (3 samples)" in one_line(text) and "with evidence" not in text


def test_describe_retrieval_lines_fit_80_columns():
    record = mixed_record("3", n=4) | {"evidence_samples": 120, "prose_samples": 880, "mix": "12.5%"}
    lines = describe_retrieval(record)
    assert lines[0].startswith("retrieval mix 12.5%: 120 of 1000 samples") and all(len(x) <= 80 for x in lines)
    assert describe_retrieval(None, 8) == ["retrieval mix: prose only (8 samples)"]
    assert describe_retrieval({"evidence_samples": 0, "prose_samples": 2}) == ["retrieval mix: prose only (2 samples)"]


# ------------------------------------------------------------------------------ quickstart
def test_quickstart_accepts_retrieval_mix_and_defaults_to_prose_only():
    parser = build_parser()
    assert parser.parse_args(["quickstart"]).retrieval_mix == "0"
    assert parser.parse_args(["quickstart", "--retrieval-mix", "0.5"]).retrieval_mix == "0.5"


@pytest.mark.parametrize(
    "mix, message",
    [
        ("lots", "--retrieval-mix 'lots': expected a count"),
        ("1.5", "--retrieval-mix '1.5': a fraction must lie in [0, 1]"),
        ("-1", "--retrieval-mix '-1': must not be negative"),
        ("3", "only 2 samples"),  # the default --calib-samples is 2
    ],
)
def test_quickstart_bad_mix_is_one_line_exit_2(tmp_path, capsys, mix, message):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--retrieval-mix", mix]) == 2
    err = capsys.readouterr().err
    assert message in one_line(err) and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


class Stop(Exception):
    """Raised by the fake `invoke` after the collect step: nothing else runs."""


@pytest.mark.parametrize("mix", [None, "0.5"])
def test_quickstart_passes_the_mix_to_collect(tmp_path, monkeypatch, mix):
    import polykv_search.cli as cli

    extra = ["--retrieval-mix", mix] if mix else []
    args = build_parser().parse_args(["quickstart", "--out", str(tmp_path / "qs"), *extra])
    calls = []

    def fake_invoke(argv, parser=None):
        if "--head-cells" not in argv:  # the head-level table (tests/test_quickstart_heads.py) comes first
            calls.append(argv)
            raise Stop

    monkeypatch.setattr(cli, "invoke", fake_invoke)
    with pytest.raises(Stop):
        args.func(args)
    (argv,) = calls
    assert argv[0] == "collect"
    if mix:
        assert argv[argv.index("--retrieval-mix") + 1] == "0.5"
        assert argv[argv.index("--out") + 1] == str(tmp_path / "qs" / "signals-retrieval.json")
    else:  # today's behaviour: prose only, signals.json
        assert "--retrieval-mix" not in argv
        assert argv[argv.index("--out") + 1] == str(tmp_path / "qs" / "signals.json")


def test_quickstart_refuses_a_retrieval_table_of_another_mix(tmp_path, capsys):
    out = tmp_path / "qs"
    out.mkdir()
    doc = random_signal_table(num_layers=2, samples=2, provenance={"retrieval": mixed_record("1", n=2)}).to_json()
    (out / "signals-retrieval.json").write_text(json.dumps(doc))
    assert main(["quickstart", "--out", str(out), "--retrieval-mix", "0.5"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "was collected with --retrieval-mix 1, not 0.5" in err and "Traceback" not in err


def test_quickstart_report_names_the_calibration(tmp_path):
    mixed = random_signal_table(num_layers=2, samples=4, provenance={"retrieval": mixed_record()}).save(
        tmp_path / "signals-retrieval.json"
    )
    text = calibration_summary(Path(mixed))
    assert text.startswith("Retrieval mix 0.5: 2 of 4 samples with evidence, 2 prose; 4 records each")
    assert text.endswith("answer tokens only.")
    prose = random_signal_table(num_layers=2, samples=2).save(tmp_path / "signals.json")
    assert calibration_summary(Path(prose)) == "Retrieval mix: prose only (2 samples)."


# ------------------------------------------------------------------------------ reproduce.py
def test_reproduce_plans_the_retrieval_aware_steps(reproduce, tmp_path):
    out = tmp_path / "repro"
    args = reproduce.parse_args(["--out", str(out), "--budgets", "64,128", "--retrieval-mix", "0.5"])
    steps = reproduce.plan(args)
    names = [s.name for s in steps]
    assert names[:2] == ["collect", "collect retrieval"]
    prose, mixed = steps[0].argv, steps[1].argv
    # the same calibration settings plus the mix; no evaluation setting reaches calibration
    head = prose[: prose.index("--out")]
    assert mixed == [*head, "--retrieval-mix", "0.5", "--out", str(out / "signals-retrieval.json")]
    assert not {"--suite", "--seed", "--calib"} & set(prose + mixed)
    for B in ("64", "128"):
        for m in ("proportional", "ilp"):
            s = steps[names.index(f"solve {m}-retrieval B={B}")]
            assert s.target == out / "strategies" / f"{m}-retrieval-B{B}.json"
            assert s.argv[s.argv.index("--signals") + 1] == str(out / "signals-retrieval.json")
            assert s.argv[s.argv.index("--method") + 1] == m
        score = steps[names.index(f"score B={B}")].argv
        scored = score[score.index("--strategy") + 1 : score.index("--out")]
        # one score run holds the prose-only and the retrieval-aware entries: paired comparison
        for name in ("proportional", "ilp", "proportional-retrieval", "ilp-retrieval"):
            assert str(out / "strategies" / f"{name}-B{B}.json") in scored
        assert names.index(f"score B={B}") > names.index(f"solve ilp-retrieval B={B}")
    prose_solves = [s for s in steps if s.argv[0] == "solve" and "retrieval" not in s.name]
    assert all(s.argv[s.argv.index("--signals") + 1] == str(out / "signals.json") for s in prose_solves)
    assert not out.exists()  # planning writes nothing


def test_reproduce_without_a_mix_plans_no_retrieval_steps(reproduce, tmp_path):
    args = reproduce.parse_args(["--out", str(tmp_path), "--budgets", "128"])
    assert args.retrieval_mix is None
    steps = reproduce.plan(args)
    assert not any("retrieval" in s.name or "signals-retrieval.json" in " ".join(s.argv) for s in steps)
    assert [s.name for s in steps if s.argv[0] == "collect"] == ["collect"]
    zero = reproduce.parse_args(["--out", str(tmp_path), "--retrieval-mix", "0"])
    assert zero.retrieval_mix is None


def test_reproduce_bad_mix_exits_2(reproduce, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        reproduce.parse_args(["--out", str(tmp_path), "--retrieval-mix", "lots"])
    assert stop.value.code == 2 and "--retrieval-mix 'lots'" in capsys.readouterr().err


def test_reproduce_rescores_when_results_lack_a_strategy(reproduce, tmp_path):
    paths = [tmp_path / "ilp-B64.json", tmp_path / "ilp-retrieval-B64.json"]
    results = tmp_path / "results-B64.json"
    results.write_text(json.dumps({"entries": [{"source": str(paths[0])}]}))
    assert not reproduce._results_cover(results, paths)  # an older prose-only run: score again
    results.write_text(json.dumps({"entries": [{"source": str(p)} for p in paths]}))
    assert reproduce._results_cover(results, paths)
    assert not reproduce._results_cover(tmp_path / "missing.json", paths)
