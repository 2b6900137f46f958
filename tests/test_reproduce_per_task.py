"""`benchmarks/reproduce.py --score-per-task`: one score run per task (task shards), each with the
samples the task has in the one run (planned only: no model is loaded here)."""

from __future__ import annotations

import json
from pathlib import Path

from polykv_search import scoring
from tests.test_eval_support import char_tokenizer, haystack_texts

RULER = [t.name for t in scoring.resolve_tasks("ruler")]


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_per_task_plans_one_score_run_per_task_and_compares_them_all(reproduce, tmp_path):
    args = reproduce.parse_args(
        ["--out", str(tmp_path), "--suite", "ruler", "--budgets", "128,256", "--seed", "3", "--score-per-task"]
    )
    steps = reproduce.plan(args)
    for B in ("128", "256"):
        runs = [s for s in steps if s.argv[0] == "score" and arg(s.argv, "--budget") == B]
        assert [arg(s.argv, "--suite") for s in runs] == RULER
        assert [int(arg(s.argv, "--seed")) for s in runs] == [3 + i for i in range(len(RULER))]
        assert [s.target for s in runs] == [tmp_path / f"results-B{B}-{t.replace('/', '-')}.json" for t in RULER]
        assert all(arg(s.argv, "--out") == str(s.target) for s in runs)
        strategies = {tuple(s.argv[s.argv.index("--strategy") : s.argv.index("--out")]) for s in runs}
        assert len(strategies) == 1  # every task scores the same entries
    compare = steps[-1].argv
    assert compare[0] == "compare" and len(compare[1 : compare.index("--across-budgets")]) == 2 * len(RULER)
    assert not any(tmp_path.iterdir())  # planning writes nothing


def test_without_the_flag_one_run_per_budget(reproduce, tmp_path):
    args = reproduce.parse_args(["--out", str(tmp_path), "--suite", "ruler", "--budgets", "256"])
    (score,) = [s for s in reproduce.plan(args) if s.argv[0] == "score"]
    assert arg(score.argv, "--suite") == "ruler" and arg(score.argv, "--seed") == "0"
    assert score.target == tmp_path / "results-B256.json"


def test_a_task_run_alone_with_its_seed_gets_the_samples_of_the_one_run():
    tok, texts = char_tokenizer(), haystack_texts()
    tasks = scoring.resolve_tasks("ruler")
    together = scoring.make_task_samples(tok, tasks, texts, n_samples=2, context_len=3000, seed=5)
    for i, task in enumerate(tasks):
        alone = scoring.make_task_samples(tok, [task], texts, n_samples=2, context_len=3000, seed=5 + i)
        assert alone[task.name][1] == together[task.name][1]


def test_finished_results_are_recognised_whether_paths_are_relative_or_absolute(reproduce, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results-B256-ruler-vt.json"
    results.write_text('{"entries": [{"source": "%s"}]}' % (tmp_path / "strategies" / "ilp-B256.json"))
    assert reproduce._results_cover(results, [Path("strategies/ilp-B256.json")])
    assert not reproduce._results_cover(results, [Path("strategies/ilp-B256.json"), Path("strategies/dp-B256.json")])


def test_a_finished_file_is_reused_only_on_the_samples_asked_for(reproduce, tmp_path):
    results = tmp_path / "results-B256-ruler-vt.json"
    strategy = tmp_path / "ilp-B256.json"
    settings = {"suite": "ruler/vt", "samples": 100, "context_len": 1024, "seed": 4, "budget": 256.0}
    results.write_text(json.dumps({"entries": [{"source": str(strategy)}], "provenance": {"settings": settings}}))
    argv = ["score", "--suite", "ruler/vt", "--samples", "100", "--context-len", "1024", "--seed", "4"]
    assert reproduce._results_cover(results, [strategy], argv)
    for flag, other in (("--samples", "24"), ("--seed", "0"), ("--context-len", "2048"), ("--suite", "ruler")):
        changed = list(argv)
        changed[changed.index(flag) + 1] = other
        assert not reproduce._results_cover(results, [strategy], changed), flag
