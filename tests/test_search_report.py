"""What `solve --method search` reports: the budget it leaves unused (exact, never "-0.0"), and its cost."""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pytest
from test_retrieval_calibration import one_thread  # noqa: F401  (autouse: one intra-op thread)
from test_search import table_path  # noqa: F401  (the tiny model and its signal table, module-scoped)

from polykv_search.cli import main
from signals import random_signal_table
from strategies import HeadGroup, LayerChoice, Strategy

KINDS = ["prose", "prose", "evidence", "evidence"]


def thirds_start() -> Strategy:
    """A head-level strategy (3 KV heads) whose layer budgets are 100/3 and 92/3 tokens, summing exactly to L·B =
    192; as floats, in this order, they sum to 192 + 2.8e-14."""
    a = LayerChoice.grouped((HeadGroup((0, 1), "snapkv", 33), HeadGroup((2,), "tova", 34)))  # mean 100/3
    b = LayerChoice.grouped((HeadGroup((0, 1), "snapkv", 31), HeadGroup((2,), "tova", 30)))  # mean 92/3
    prefill = [a, b, b, b, a, a]
    prov = {"phases_following": {"decoding": "prefill"}}
    return Strategy(prefill, list(prefill), 32.0, 8, prov, context_len=64, num_kv_heads=3)


@pytest.fixture
def constant_objective(monkeypatch):
    """The search's objective replaced by one that gives every strategy the same KL: no move is resolved better,
    so the result is the start."""
    from solvers.whole_model import WholeModelSolver

    @contextmanager
    def objective(self, problem):
        yield (lambda strategies: np.ones((len(KINDS), len(strategies)))), KINDS, {"evaluator": "test"}

    monkeypatch.setattr(WholeModelSolver, "_objective", objective)


def test_the_unused_budget_is_exact_and_printed_as_0_never_minus_0(tmp_path, constant_objective, capsys):
    assert sum(float(b) for b in thirds_start().budgets("prefill")) > 192  # the float sum the old count used
    table = random_signal_table(6, budgets=(16, 32, 64), patterns=("snapkv", "tova"), seed=1)
    signals, start, out = tmp_path / "sig.json", tmp_path / "start.json", tmp_path / "s.json"
    table.save(signals)
    thirds_start().save(start)
    argv = ["solve", "--method", "search", "--signals", str(signals), "--budget", "32", "--b-min", "8", "--phases"]
    argv += ["prefill"]
    argv += ["--start", str(start), "--max-evaluations", "6", "--progress", "false", "--out", str(out)]
    assert main(argv) == 0
    written = Strategy.load(out)
    assert written.digest() == thirds_start().digest()  # the result is the start
    assert written.provenance["unused_budget"] == {"prefill": 0, "decoding": 0}
    assert "-0.0" not in out.read_text()
    err = " ".join(capsys.readouterr().err.split())
    assert "unused budget (of 192 tokens per phase): prefill 0 (0.0%), decoding 0 (0.0%)" in err
    assert "-0.0" not in err


def test_a_fractional_unused_budget_is_kept_as_it_is():
    from solvers import Problem
    from solvers.whole_model import WholeModelSolver

    start = thirds_start()
    start.prefill[0] = LayerChoice.grouped((HeadGroup((0, 1), "snapkv", 32), HeadGroup((2,), "tova", 34)))  # 98/3
    start = Strategy(start.prefill, list(start.prefill), 32.0, 8, start.provenance, context_len=64, num_kv_heads=3)
    table = random_signal_table(6, budgets=(16, 32, 64), patterns=("snapkv", "tova"), seed=1)
    p = Problem(global_budget=32, table=table, b_min=8, phases=["prefill"], patterns=["snapkv", "tova"])

    def evaluator(strategies):
        return np.ones((len(KINDS), len(strategies)))

    solver = WholeModelSolver(start="x.json", evaluator=evaluator, kinds=KINDS, max_evaluations=4)
    solver._calibrated_start = lambda problem: ("start-x", start)  # noqa: SLF001
    result = solver.solve(p)
    assert result.unused_budget["prefill"] == pytest.approx(2 / 3) and json.dumps(result.unused_budget)


def test_a_start_file_of_another_b_min_is_refused_in_one_line(tmp_path, constant_objective, capsys):
    """The search writes the strategies it measured; a start solved with another b_min would be written with the
    problem's, so it is refused (it used to end in "internal error, the written strategy is not the searched one")."""
    table = random_signal_table(6, budgets=(16, 32, 64), patterns=("snapkv", "tova"), seed=1)
    signals, start, out = tmp_path / "sig.json", tmp_path / "start.json", tmp_path / "s.json"
    table.save(signals)
    thirds_start().save(start)  # b_min 8; the problem's default: min(16, B) = 16
    argv = ["solve", "--method", "search", "--signals", str(signals), "--budget", "32", "--phases", "prefill"]
    argv += ["--start", str(start), "--progress", "false", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"start: {start} has b_min=8, the problem b_min=16; give --b-min 8" in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "s.json.journal").exists()


# ------------------------------------------------------------------------------ on the tiny model
def search_argv(tiny, out) -> list[str]:
    ckpt, table = tiny
    argv = ["solve", "--method", "search", "--signals", str(table), "--budget", "24", "--model", str(ckpt)]
    argv += ["--samples", "4", "--max-evaluations", "6", "--blocks", "2", "--progress", "false"]
    return [*argv, "--out", str(out)]


def test_a_search_killed_mid_run_resumes_from_its_journal_to_the_uninterrupted_result(
    table_path,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    """Ctrl-C in the middle of a round: exit 130, nothing written but the journal; the same command again measures
    only what the journal lacks and writes the strategy an uninterrupted search writes, with the same values."""
    from solvers.search_objective import WholeModelObjective

    whole = tmp_path / "whole" / "s.json"
    assert main(search_argv(table_path, whole)) == 0
    reference = Strategy.load(whole).provenance["search"]
    report = " ".join(capsys.readouterr().out.split())
    runs = reference["cost"]["strategy_runs"]
    assert runs == 24 and reference["strategies_evaluated"] == 6  # 3 starts and 3 moves, on 4 samples
    assert "search cost: 6 strategies measured, 24 strategy runs and 4 FullKV references in " in report
    assert "(0 values from the journal)" in report and " min, " in report and " in the model" in report

    batches = [0]
    run_batch = WholeModelObjective._run_batch

    def killed(self, *args, **kwargs):
        batches[0] += 1
        if batches[0] > 5:  # the starts' 4 batches (one per sample), then one of the first round's
            raise KeyboardInterrupt
        return run_batch(self, *args, **kwargs)

    monkeypatch.setattr(WholeModelObjective, "_run_batch", killed)
    out = tmp_path / "killed" / "s.json"
    assert main(search_argv(table_path, out)) == 130
    err = " ".join(capsys.readouterr().err.split())
    assert f"interrupted: measured strategies are kept in {out}.journal; rerun the same command to continue" in err
    assert not out.exists() and out.with_name("s.json.journal").exists()
    monkeypatch.setattr(WholeModelObjective, "_run_batch", run_batch)

    assert main(search_argv(table_path, out)) == 0
    resumed = Strategy.load(out)
    record = resumed.provenance["search"]
    kept = record["cost"]["values_from_journal"]
    assert kept == 3 * 4 + 3  # the starts on every sample, the first round's moves on the first sample
    assert record["cost"]["strategy_runs"] == runs - kept  # nothing measured twice
    assert resumed.digest() == Strategy.load(whole).digest()
    assert record["per_sample"] == reference["per_sample"] and record["moves"] == reference["moves"]
    assert record["starts"] == reference["starts"] and record["start"] == reference["start"]
