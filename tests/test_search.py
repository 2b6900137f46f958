"""The whole-model search: moves kept only when resolved better, never worse than its start, feasible after
every move, resumable without measuring anything twice."""

from __future__ import annotations

import json
import types
from fractions import Fraction

import numpy as np
import pytest
import torch
from test_retrieval_calibration import one_thread  # noqa: F401  (autouse: one intra-op thread)
from tiny import tiny_model

from polykv_search.stats import paired_difference_interval
from solvers import Problem
from solvers.guard import strata, uniform_candidates
from solvers.search_loop import local_search
from solvers.search_objective import SearchJournal, WholeModelObjective
from solvers.search_space import SearchSpace, check_budgets
from solvers.uniform import UniformSettings, UniformSolver
from strategies import HeadGroup, LayerChoice, Strategy

KINDS = ["prose"] * 6 + ["evidence"] * 6
PATTERNS = ["snapkv", "tova", "kvzip[allocation=model]"]


def problem(**kw) -> Problem:
    args = {"global_budget": 32, "num_layers": 6, "patterns": PATTERNS, "b_min": 8, "phases": ["prefill"], **kw}
    return Problem(**args)


def uniform(p: Problem, pattern: str = "snapkv") -> Strategy:
    return UniformSolver(UniformSettings(pattern=pattern)).solve(p).strategy


def space_for(p: Problem, blocks: int = 3, step: int = 8):
    return lambda start: SearchSpace(p, start, blocks=blocks, step=step, patterns=p.patterns)


def fake_objective(gain: float, noise: float, seed: int = 0):
    """Per-sample KL: 1 + ``gain`` per 32 tokens moved from the first half of the layers to the second, plus
    per-sample noise of sd ``noise`` (fixed per sample, so differences between strategies are exactly the gain)
    and a small draw per measurement."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, noise, len(KINDS))

    def objective(strategies):
        cols = []
        for s in strategies:
            b = np.array(s.budgets("prefill"), float)
            half = len(b) // 2
            shift = (b[half:].sum() - b[:half].sum()) / 32
            cols.append(1.0 - gain * shift + base + rng.normal(0, noise, len(KINDS)))
        return np.stack(cols, 1)

    return objective


# ------------------------------------------------------------------------------ acceptance rule
def test_a_move_whose_gain_is_inside_its_interval_is_rejected():
    p = problem()
    trace = local_search(
        [("start", uniform(p))], space_for(p), fake_objective(0.001, 0.2), KINDS, max_evaluations=25, neighbors=4
    )
    assert trace.steps == [] and trace.result.digest() == uniform(p).digest() and trace.final is None
    # 6 budget moves between 3 blocks + 2 other patterns in each block, none resolved: all tried, then stop
    assert trace.evaluated == 1 + 12 and trace.stop == "no untried move" and trace.rounds == 3


def test_a_resolved_move_is_accepted_with_its_interval():
    p = problem()
    trace = local_search(
        [("start", uniform(p))], space_for(p), fake_objective(0.05, 0.001), KINDS, max_moves=2, max_evaluations=40
    )
    assert len(trace.steps) == 2 and trace.stop == "max_moves"
    for step in trace.steps:
        assert step.versus.high < 0 and step.move.kind in ("budget", "fill")
    budgets = trace.result.budgets("prefill")
    assert sum(budgets[3:]) > sum(budgets[:3])  # budget went where the objective rewards it
    assert trace.final is not None and trace.final.high < 0 and trace.kept_steps == 2


def test_the_start_is_the_lowest_of_the_calibrated_solve_and_the_uniforms():
    p = problem()
    solved = uniform(p, "tova")
    starts = [("ilp", solved), *uniform_candidates(p, solved)]
    offsets = {"ilp": 0.3, "uniform-snapkv": 0.2, "uniform-kvzip[allocation=model]": 0.1}

    def objective(strategies):
        names = {s.digest(): n for n, s in starts}
        return np.stack([np.full(len(KINDS), 1.0 + offsets[names.get(s.digest(), "ilp")]) for s in strategies], 1)

    trace = local_search(starts, space_for(p), objective, KINDS, max_evaluations=3)
    assert trace.start == "uniform-kvzip[allocation=model]" and set(trace.starts) == set(offsets)
    assert trace.result.patterns("prefill") == ["kvzip"] * 6


# ------------------------------------------------------------------------------ guarantee
@pytest.mark.parametrize("seed", range(8))
def test_the_result_is_never_resolved_worse_than_its_start(seed):
    """Whatever the objective (here random: per-sample values with no structure the moves can exploit, plus
    a random gain), the result is the start or resolved below it on the same samples."""
    rng = np.random.default_rng(seed)
    table = {}

    def objective(strategies):
        return np.stack([table.setdefault(s.digest(), rng.gamma(2.0, 0.5, len(KINDS))) for s in strategies], 1)

    p = problem()
    start = uniform(p, PATTERNS[seed % 3])
    starts = [("start", start), *uniform_candidates(p, start)]
    trace = local_search(starts, space_for(p), objective, KINDS, max_evaluations=30, seed=seed)
    start = dict(starts)[trace.start]
    result, first = table[trace.result.digest()], table[start.digest()]
    iv = paired_difference_interval(strata(result, KINDS), strata(first, KINDS))
    assert not iv.low > 0  # never resolved worse
    assert trace.versus_starts[trace.start].estimate == pytest.approx(iv.estimate)
    assert all(not v.low > 0 for v in trace.versus_starts.values())  # nor worse than any candidate offered
    assert trace.result.digest() == start.digest() or (trace.final.high < 0 and iv.high < 0)


# ------------------------------------------------------------------------------ constraints
def head_level_start(p: Problem) -> Strategy:
    groups = (HeadGroup((0,), "full", 64), HeadGroup((1, 2), "streaming_llm", 16, {"n_sink": 4}))
    choice = LayerChoice.grouped(groups)
    uniform_rest = LayerChoice("snapkv", 32)
    prefill = [choice, choice, LayerChoice.grouped((HeadGroup((0, 1, 2), "tova", 20),)), uniform_rest] + [
        LayerChoice.grouped((HeadGroup((0, 1, 2), "snapkv", 24),))
    ] * 2
    prov = {"phases_following": {"decoding": "prefill"}}
    return Strategy(prefill, list(prefill), 32.0, 8, prov, context_len=64, num_kv_heads=3)


def totals(strategy: Strategy) -> list[Fraction]:
    return [Fraction(b).limit_denominator(1000) for b in strategy.budgets("prefill")]


@pytest.mark.parametrize("shape", ["layer", "head"])
def test_budget_constraints_hold_after_every_move(shape):
    p = problem()
    start = uniform(p) if shape == "layer" else head_level_start(p)
    space = SearchSpace(p, start, blocks=3, step=8, patterns=p.patterns)
    current = start
    for k, move in enumerate(space.moves(start) * 2):
        nxt = space.apply(current, move)
        if nxt is None:
            continue
        check_budgets(nxt, p)  # raises on a breach
        b = totals(nxt)
        assert sum(b) <= p.total and min(b) >= p.b_min
        if move.kind == "budget":
            assert sum(b) <= sum(totals(current))  # moved, never created
        if shape == "head":
            assert nxt.decoding == nxt.prefill and nxt.num_kv_heads == 3  # decoding follows prefill's heads
            keep_all = [g for c in nxt.prefill if c.head_groups for g in c.head_groups if g.pattern == "full"]
            assert len(keep_all) == 2  # keep-all heads are never moved
        if k % 3 == 0:
            current = nxt


@pytest.mark.parametrize("shape", ["layer", "head"])
def test_an_unchanged_state_writes_the_start_back_exactly(shape):
    p = problem()
    start = uniform(p) if shape == "layer" else head_level_start(p)  # with params at their defaults (n_sink=4)
    space = SearchSpace(p, start, blocks=3, step=8, patterns=p.patterns)
    assert space.build(space.state(start)).digest() == start.digest()


def test_a_pattern_swap_changes_only_the_heads_that_had_the_replaced_pattern():
    p = problem()
    start = head_level_start(p)
    space = SearchSpace(p, start, blocks=3, step=8, patterns=p.patterns)
    moves = space.moves(start)
    swap = next(m for m in moves if m.target == 0 and (m.replaces, m.pattern) == ("streaming_llm", "tova"))
    after = space.apply(start, swap)
    for layer in (0, 1):
        assert [(g.heads, g.pattern, g.budget) for g in after.prefill[layer].head_groups] == [
            ((0,), "full", 64),
            ((1, 2), "tova", 16),
        ]
    assert after.prefill[2:] == start.prefill[2:] and "streaming_llm -> tova" in swap.label(space.blocks)


def test_a_budget_move_keeps_the_total_and_never_goes_below_b_min():
    p = problem(global_budget=16, b_min=12)
    space = SearchSpace(p, uniform(p), blocks=2, step=8, patterns=p.patterns)
    moved = space.apply(uniform(p), next(m for m in space.moves(uniform(p)) if m.kind == "budget"))
    assert moved.budgets("prefill") == [12, 12, 12, 20, 20, 20]  # 4 of the 8 asked: b_min stops it


# ------------------------------------------------------------------------------ resume
@pytest.fixture(scope="module")
def tiny():
    model = tiny_model("llama", layers=2, seed=4)
    g = torch.Generator().manual_seed(5)
    samples = [
        types.SimpleNamespace(
            context_ids=torch.randint(4, 128, (64,), generator=g).tolist(),
            continuation_ids=torch.randint(4, 128, (6,), generator=g).tolist(),
            scored=(1, 5) if i % 2 else None,
        )
        for i in range(4)
    ]
    return model, samples


class Killed(Exception):
    pass


def run_search(model, samples, journal, *, kill_after=None):
    p = problem(num_layers=2, global_budget=24, patterns=["snapkv", "tova"], b_min=4)
    count = [0]

    def on_run():
        count[0] += 1
        if kill_after is not None and count[0] >= kill_after:
            raise Killed

    objective = WholeModelObjective(model, samples, journal, on_run=on_run)
    starts = [("snapkv", uniform(p)), ("tova", uniform(p, "tova"))]
    trace = local_search(starts, space_for(p, blocks=2, step=4), objective, objective.kinds, max_evaluations=6)
    return trace, objective


def test_a_killed_search_resumes_without_measuring_anything_twice(tiny, tmp_path):
    model, samples = tiny
    key = {"model": "tiny", "model_fingerprint": "x", "samples": {"n": 4}, "definition": "v1"}
    whole, ref = run_search(model, samples, SearchJournal.open(None, key))
    path = tmp_path / "s.journal"
    with pytest.raises(Killed):
        run_search(model, samples, SearchJournal.open(path, key), kill_after=7)
    journal = SearchJournal.open(path, key)
    assert len(journal.values) == 7
    trace, objective = run_search(model, samples, journal)
    assert objective.runs == ref.runs - 7 and objective.cached == 7  # nothing measured twice
    assert trace.result.digest() == whole.result.digest() and len(trace.steps) == len(whole.steps)
    np.testing.assert_array_equal(trace.values, whole.values)
    again, objective = run_search(model, samples, SearchJournal.open(path, key))
    assert objective.runs == 0 and again.result.digest() == whole.result.digest()


def test_a_journal_of_other_samples_is_refused(tmp_path):
    from signals.journal import JournalMismatch

    key = {"model": "tiny", "model_fingerprint": "x", "samples": {"n": 4}, "definition": "v1"}
    SearchJournal.open(tmp_path / "j", key).close()
    with pytest.raises(JournalMismatch, match="calibration samples"):
        SearchJournal.open(tmp_path / "j", {**key, "samples": {"n": 5}})


# ------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    from test_retrieval_calibration import char_tokenizer
    from test_retrieval_calibration_cli import cli_argv

    from polykv_search.cli import main

    ckpt = tmp_path_factory.mktemp("search-tiny")
    tiny_model("llama", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    corpus = ckpt / "corpus.txt"
    corpus.write_text(" ".join(f"It was the {i}th day of the fair, and the lanes were full. Why?" for i in range(120)))
    out = ckpt / "table.json"
    argv = cli_argv(ckpt, corpus, out, "--retrieval-mix", "1", "--evidence-records", "3")
    argv[argv.index("--patterns") + 1] = "snapkv,tova"
    argv[argv.index("--budgets") + 1] = "16,32"
    argv[argv.index("--layers") + 1] = "all"
    assert main(argv) == 0
    return ckpt, out


def test_solve_search_end_to_end_and_a_rerun_measures_nothing(table_path, tmp_path, capsys):
    from polykv_search.cli import main

    ckpt, table = table_path
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "search", "--signals", str(table), "--budget", "24", "--model", str(ckpt)]
    argv += ["--samples", "4", "--max-evaluations", "5", "--blocks", "2", "--progress", "false", "--out", str(out)]
    assert main(argv) == 0
    first = json.loads(out.read_text())
    search = first["provenance"]["search"]
    assert first["provenance"]["solver"] == "search" and search["start"] in search["starts"]
    assert set(search["starts"]) == {"ilp", "uniform-snapkv", "uniform-tova"}
    assert search["strategies_evaluated"] == 5 and search["cost"]["strategy_runs"] == 20
    assert search["cost"]["forward_calls"] > 20 and search["samples"]["n"] == 4
    assert all(m["versus_before"]["high"] < 0 for m in search["moves"])
    captured = capsys.readouterr()
    assert "strategy runs" in captured.err
    assert "search: KL to FullKV on 4 calibration samples (2 evidence, 2 prose)" in " ".join(captured.out.split())
    assert (tmp_path / "s.json.journal").exists()
    assert main(argv) == 0
    again = json.loads(out.read_text())["provenance"]["search"]
    assert again["cost"]["strategy_runs"] == 0 and again["cost"]["values_from_journal"] == 20
    assert again["per_sample"] == search["per_sample"] and again["moves"] == search["moves"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--step", "2"], "step: a share of B in (0, 1]"),
        (["--start", "optuna"], "start: 'optuna' cannot be the start"),
        (["--start", "missing.json"], "start: strategy: cannot read missing.json"),
        (["--start-settings", "granularity"], "start_settings: 'granularity' is not KEY=VALUE"),
        (["--guard", "4"], "--guard does not apply to search"),
        (["--samples", "1"], "samples: must be at least 2"),
        (["--batch-entries", "0"], "batch_entries: must be at least 1"),
    ],
)
def test_bad_search_input_is_one_line_and_exit_2(table_path, tmp_path, capsys, extra, message):
    from polykv_search.cli import main

    _, table = table_path
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "search", "--signals", str(table), "--budget", "24", "--out", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "s.json.journal").exists()


# ------------------------------------------------------------------------------ the solver, model-free
def test_the_solver_searches_from_a_head_level_start_file_and_keeps_its_following_phase(tmp_path):
    """``--start FILE``: a head-level strategy (decoding follows prefill) is searched as it is and written with its
    phases as measured; the objective here rewards head groups and budget in the later layers."""
    from signals import random_signal_table
    from solvers.whole_model import WholeModelSolver

    table = random_signal_table(6, budgets=(16, 32, 64), patterns=("snapkv", "tova"), seed=1)
    p = Problem(global_budget=32, table=table, b_min=8, phases=["prefill"], patterns=["snapkv", "tova"])
    start = head_level_start(p)
    path = start.save(tmp_path / "head.json")
    seen = []

    def evaluator(strategies):
        seen.extend(strategies)
        heads = np.array([0.5 * s.has_head_groups for s in strategies])
        return fake_objective(0.05, 0.001)(strategies) - heads

    solver = WholeModelSolver(start=str(path), evaluator=evaluator, kinds=KINDS, max_moves=2, max_evaluations=30)
    result = solver.solve(p)
    s, search = result.strategy, result.strategy.provenance["search"]
    offered = {"start-head", "uniform-snapkv", "uniform-tova", "uniform-streaming_llm"}  # its heads' patterns too
    assert search["start"] == "start-head" and set(search["starts"]) == offered
    assert s.has_head_groups and s.decoding == s.prefill and s.provenance["phases_following"] == {"decoding": "prefill"}
    assert len(search["moves"]) == 2 and all(m["versus_before"]["high"] < 0 for m in search["moves"])
    assert s.digest() == solver.trace.result.digest()
    for strategy in seen:
        check_budgets(strategy, p)


def test_budget_moved_inside_the_pool_is_no_move():
    """kvzip[allocation=model] ranks its tokens over the model at the sum of its budgets: moving budget between
    pooled layers changes nothing, so the search does not spend a measurement on it."""
    p = problem()
    pooled = uniform(p, "kvzip[allocation=model]")
    space = SearchSpace(p, pooled, blocks=3, step=8, patterns=p.patterns)
    assert all(space.apply(pooled, m) is None for m in space.moves(pooled) if m.kind == "budget")
    to_tova = next(m for m in space.moves(pooled) if (m.replaces, m.pattern) == (PATTERNS[2], "tova"))
    mixed = space.apply(pooled, to_tova)
    assert any(space.apply(mixed, m) is not None for m in space.moves(mixed) if m.kind == "budget")


@pytest.mark.parametrize("spec", ["kvzip[allocation=model,floor=8]", "kvzip[allocation=model,evidence=0.25]"])
def test_budget_moved_inside_a_pool_with_per_head_shares_is_a_move(spec):
    """A floor or an evidence share counts min(floor, b) or floor(evidence * b) tokens per head: moving budget
    between such pooled layers changes what each head keeps, so the search measures it."""
    p = problem()
    pooled = uniform(p, spec)
    space = SearchSpace(p, pooled, blocks=3, step=8, patterns=p.patterns)
    assert any(space.apply(pooled, m) is not None for m in space.moves(pooled) if m.kind == "budget")


def test_the_search_measures_half_evidence_samples_when_the_table_has_none():
    """A prose-only objective cannot see a lost fact: a table collected on prose alone gets half evidence
    samples unless ``mix`` says otherwise; a table with evidence keeps its own share (the guard's rule)."""
    import types

    from solvers.whole_model import measure_mix

    def table(retrieval):
        return types.SimpleNamespace(provenance={"retrieval": retrieval} if retrieval is not None else {})

    assert measure_mix(None, table({"evidence_samples": 0, "prose_samples": 4})) == "0.5"
    assert measure_mix(None, table(None)) == "0.5"
    assert measure_mix("0", table({"evidence_samples": 0, "prose_samples": 4})) == "0"
    assert measure_mix(None, table({"evidence_samples": 2, "prose_samples": 2})) is None


def test_the_samples_follow_the_chosen_protocol_and_default_to_the_tables(table_path):
    """``protocol`` draws the same facts with the query where the strategy will be deployed (closing the compressed
    context, question-aware); omitted, the table's protocol, and the journal's key as before."""
    from transformers import AutoTokenizer

    from polykv_search.protocol import AGNOSTIC, AWARE
    from signals.table import SignalTable
    from solvers.guard import guard_samples

    ckpt, path = table_path
    tokenizer, table = AutoTokenizer.from_pretrained(ckpt), SignalTable.load(path)
    default, described = guard_samples(tokenizer, table, 4, mix="4")
    agnostic, _ = guard_samples(tokenizer, table, 4, mix="4", protocol=AGNOSTIC)
    aware, aware_described = guard_samples(tokenizer, table, 4, mix="4", protocol=AWARE)
    assert "protocol" not in described and aware_described["protocol"] == AWARE
    assert [s.protocol for s in default] == [AGNOSTIC] * 4 == [s.protocol for s in agnostic]
    assert [s.protocol for s in aware] == [AWARE] * 4
    for a, b in zip(agnostic, aware):
        assert (a.statements, a.queried, len(a.context_ids)) == (b.statements, b.queried, len(b.context_ids))
        query = len(b.context_ids) - b.prose_context - sum(end - start for start, end in b.evidence_spans)
        assert query > 0 and list(b.context_ids[-query:]) == list(a.continuation_ids[:query])


def test_a_protocol_that_does_not_exist_is_refused_before_anything_runs(table_path, tmp_path, capsys):
    from polykv_search.cli import main

    _, table = table_path
    out = tmp_path / "s.json"
    argv = ["solve", "--method", "search", "--signals", str(table), "--budget", "24", "--out", str(out)]
    assert main([*argv, "--protocol", "question-first"]) == 2
    err = capsys.readouterr().err.strip()
    assert "protocol: 'question-first' is not one of" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_start_whose_lower_mean_is_inside_its_interval_does_not_replace_the_calibrated_solve():
    """The guard's rule picks the start: a uniform with a lower mean KL that is not resolved below the calibrated
    solve (noisy, as 8 calibration samples are) leaves the solve as the start; one resolved below replaces it."""
    p = problem()
    solved = uniform(p, "tova")
    starts = [("ilp", solved), *uniform_candidates(p, solved)]
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, 0.5, size=(len(KINDS), len(starts)))

    def run(offsets):
        def objective(strategies):
            names = {s.digest(): j for j, (_, s) in enumerate(starts)}
            cols = [names.get(s.digest(), 0) for s in strategies]
            return np.stack([1.5 + offsets[j] + noise[:, j] for j in cols], 1)

        return local_search(starts, space_for(p), objective, KINDS, max_evaluations=len(starts))

    unresolved = run([0.0, -0.05, 0.3])  # snapkv's mean is lower by less than the noise
    assert unresolved.starts["uniform-snapkv"].estimate < unresolved.starts["ilp"].estimate
    assert unresolved.start == "ilp"
    resolved = run([0.0, -1.5, 0.3])  # far below the solve on every sample
    assert resolved.start == "uniform-snapkv"
