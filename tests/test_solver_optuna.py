"""The optuna solver: trials scored by the runtime on calibration samples, anchors first,
resumable through its journal storage, a Pareto front for quality,memory, one-line errors."""

from __future__ import annotations

import pytest
import torch

from signals import random_signal_table
from solvers import Problem, SolverError, get_solver, get_solver_class, list_methods
from solvers.base import predict_degradation
from solvers.optuna_search import OptunaSolver, best_uniform_pattern, front_strategies
from strategies import PHASES, Strategy
from tests.test_eval_support import char_tokenizer
from tests.tiny import tiny_model

PATTERNS = ("snapkv", "tova", "h2o", "streaming_llm")
RUNTIME = dict(samples=2, context_len=160, corpus="pydoc", tasks="broad/continuation")


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny model runs faster on one thread than on several busy cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def loaded():
    return tiny_model("llama", layers=3), char_tokenizer()


def problem(L: int = 3, B: float = 24, b_min: int = 4, seed: int = 1, **kw) -> Problem:
    table = random_signal_table(L, budgets=(8, 16, 32, 64), patterns=PATTERNS, seed=seed)
    return Problem(global_budget=B, table=table, b_min=b_min, **kw)


def predicted_quality(prob: Problem):
    """A cheap deterministic evaluator: minus the table's predicted ΔPPL."""
    calls = []

    def evaluate(strategy):
        calls.append(strategy)
        return -predict_degradation(prob.table, strategy, prob.phases, "dppl")

    evaluate.calls = calls
    return evaluate


def check_feasible(strategy: Strategy, prob: Problem, budget: float | None = None) -> None:
    budget = prob.global_budget if budget is None else budget
    again = Strategy.from_json(strategy.to_json())  # validates
    assert again == strategy and strategy.num_layers == prob.num_layers
    for phase in PHASES:
        bs = strategy.budgets(phase)
        assert all(isinstance(b, int) and b >= prob.b_min for b in bs)
        assert sum(bs) <= int(prob.num_layers * budget + 1e-9)
        assert set(strategy.patterns(phase)) <= set(prob.patterns) | {prob.default_pattern}


def trial_choices(trial, prob):
    return {p: [tuple(c) for c in trial.user_attrs["choices"][p]] for p in prob.phases}


def strategy_choices(strategy, prob):
    return {p: [(c.pattern, c.budget) for c in strategy.phase(p)] for p in prob.phases}


# ----------------------------------------------------------------------------- registry
def test_registered_with_settings_as_flags():
    info = {m.name: m for m in list_methods()}["optuna"]
    assert info.available and info.needs_table
    flags = {i.flag for i in get_solver_class("optuna").Settings.fields_info()}
    assert {"--trials", "--storage", "--jobs", "--study-name", "--objectives", "--space", "--tasks"} <= flags
    s = get_solver_class("optuna").Settings.from_strings(
        {"trials": "5", "objectives": "quality,memory", "storage": "memory"}
    )
    assert s.trials == 5 and s.two_objectives


# ------------------------------------------------------------------- real runtime study
def test_short_study_on_tiny_model_beats_or_matches_its_anchors(loaded, tmp_path):
    prob = problem()
    solver = OptunaSolver(
        loaded_model=loaded, trials=10, storage=str(tmp_path / "s.journal"), metric="log-ppl", **RUNTIME
    )
    result = solver.solve(prob)
    study = solver.study
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len([t for t in done if not t.user_attrs.get("cached")]) == 10  # repeats are free
    anchors = {t.user_attrs["anchor"]: t for t in done if "anchor" in t.user_attrs}
    assert [t.number for t in anchors.values()] == [0, 1, 2]  # enqueued first
    assert set(anchors) == {"proportional", "ilp", "uniform-best"}
    best = max(done, key=lambda t: (t.value, -t.number))
    assert best.value >= max(t.value for t in anchors.values())
    assert result.info["best"]["trial"] == best.number
    assert strategy_choices(result.strategy, prob) == trial_choices(best, prob)
    check_feasible(result.strategy, prob)
    # the anchors are the real solvers' strategies
    assert trial_choices(anchors["proportional"], prob) == strategy_choices(
        get_solver("proportional").solve(prob).strategy, prob
    )
    assert trial_choices(anchors["ilp"], prob) == strategy_choices(get_solver("ilp").solve(prob).strategy, prob)
    pattern, _ = best_uniform_pattern(prob)
    assert anchors["uniform-best"].params["uniform_pattern"] == pattern
    # provenance: explicit sampler, calibration split (never the eval split), the runtime's scores
    prov = result.strategy.provenance
    assert prov["solver"] == "optuna" and prov["settings"]["trials"] == 10
    opt = prov["optuna"]
    assert opt["sampler"]["class"] == "TPESampler" and opt["sampler"]["multivariate"] is True
    assert opt["sampler"]["seed"] == 0 and opt["sampler"]["n_startup_trials"] == 10
    assert opt["calibration"]["split"]["role"] == "calib" and opt["calibration"]["context_len"] == 160
    assert len(opt["anchors"]) == 3 and opt["front"] is None
    assert "broad/continuation" in best.user_attrs["scores"]
    assert front_strategies(result) == [("", result.strategy)]


def test_threads_each_use_their_own_model_copy(loaded, tmp_path):
    prob = problem(seed=3)
    solver = OptunaSolver(loaded_model=loaded, trials=6, jobs=2, storage=str(tmp_path / "j.journal"), **RUNTIME)
    result = solver.solve(prob)
    assert len([t for t in solver.study.trials if t.state.name == "COMPLETE" and not t.user_attrs.get("cached")]) >= 6
    check_feasible(result.strategy, prob)


# ------------------------------------------------------------------------------ resume
@pytest.mark.parametrize("killed_after", [1, 4])
def test_killed_study_resumes_from_its_journal(tmp_path, monkeypatch, killed_after):
    monkeypatch.setenv("POLYKV_CACHE", str(tmp_path))  # the default journal lives in the cache
    prob = problem(L=4, seed=5)
    score = predicted_quality(prob)
    limit = [killed_after]

    def evaluate(strategy):  # the same evaluator both times; it "dies" after killed_after scores
        if len(score.calls) >= limit[0]:
            raise RuntimeError("killed")
        return score(strategy)

    first = OptunaSolver(evaluator=evaluate, trials=8)
    with pytest.raises(RuntimeError, match="killed"):
        first.solve(prob)
    kept = {t.number: t.values for t in first.study.trials if t.state.name == "COMPLETE"}
    assert len(score.calls) == killed_after and len(kept) >= killed_after
    journal = list((tmp_path / "optuna").glob("polykv-*.journal"))
    assert len(journal) == 1

    limit[0] = 10**6
    resumed = OptunaSolver(evaluator=evaluate, trials=8)
    result = resumed.solve(prob)
    trials = resumed.study.trials
    assert resumed.study.study_name == first.study.study_name
    assert {t.number: t.values for t in trials if t.number in kept} == kept  # finished trials kept
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len([t for t in done if not t.user_attrs.get("cached")]) == 8 == len(score.calls)
    anchors = [t.user_attrs["anchor"] for t in done if "anchor" in t.user_attrs]
    assert sorted(anchors) == ["ilp", "proportional", "uniform-best"]  # each once, not re-enqueued
    check_feasible(result.strategy, prob)

    again = OptunaSolver(evaluator=evaluate, trials=8).solve(prob)  # nothing left to run
    assert again.strategy.to_json()["layers"] == result.strategy.to_json()["layers"]
    assert again.strategy.provenance["optuna"]["trials_run_now"] == 0


def test_resuming_a_study_made_for_another_problem_is_refused(tmp_path):
    storage = str(tmp_path / "s.journal")
    prob = problem()
    OptunaSolver(evaluator=predicted_quality(prob), trials=4, storage=storage, study_name="s").solve(prob)
    other = problem(B=32)
    with pytest.raises(SolverError, match="different problem") as err:
        OptunaSolver(evaluator=predicted_quality(other), trials=4, storage=storage, study_name="s").solve(other)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------- two objectives
@pytest.mark.parametrize("mo_sampler", ["tpe", "nsga2"])
def test_quality_memory_gives_a_pareto_front_of_feasible_strategies(loaded, mo_sampler):
    prob = problem(phases=("prefill",))
    solver = OptunaSolver(
        loaded_model=loaded,
        trials=10,
        storage="memory",
        objectives="quality,memory",
        mo_sampler=mo_sampler,
        population=4,
        metric="log-ppl",
        **RUNTIME,
    )
    result = solver.solve(prob)
    points = front_strategies(result)
    assert len(points) >= 1 and len({s for s, _ in points}) == len(points)
    values = [st.provenance["pareto_point"]["values"] for _, st in points]
    mem = [v[1] for v in values]
    assert mem == sorted(mem)
    for i, a in enumerate(values):  # mutually non-dominated
        for j, b in enumerate(values):
            if i != j:
                assert not (b[0] >= a[0] and b[1] <= a[1] and b != a)
    for _, st in points:
        assert st.global_budget <= prob.global_budget and st.provenance["budget_cap"] == prob.global_budget
        check_feasible(st, prob, budget=st.global_budget)
        assert st.provenance["optuna"]["sampler"]["class"] == ("TPESampler" if mo_sampler == "tpe" else "NSGAIISampler")
    assert len(result.strategy.provenance["optuna"]["front"]) == len(points)
    best_q = max(values, key=lambda v: (v[0], -v[1]))
    main = points[values.index(best_q)][1]
    assert result.strategy.to_json()["layers"] == main.to_json()["layers"]
    assert result.strategy.global_budget == main.global_budget


# ----------------------------------------------------------------------- per-layer space
def test_per_layer_space_is_an_ablation_with_the_same_anchors(tmp_path):
    prob = problem(L=4, seed=7)
    solver = OptunaSolver(evaluator=predicted_quality(prob), trials=12, space="per-layer", storage="memory")
    result = solver.solve(prob)
    first = solver.study.trials[0]
    assert first.user_attrs["anchor"] == "proportional" and first.params["family"] == "per-layer"
    assert "prefill_pattern_000" in first.params and "alpha" not in first.params
    assert trial_choices(first, prob) == strategy_choices(get_solver("proportional").solve(prob).strategy, prob)
    check_feasible(result.strategy, prob)
    best_anchor = max(t.value for t in solver.study.trials if "anchor" in t.user_attrs)
    assert result.info["best"]["quality"] >= best_anchor


def test_rule_at_the_proportional_point_is_proportional_on_random_tables():
    for seed in range(20):
        prob = problem(L=6, B=20 + seed, b_min=2, seed=seed)
        solver = OptunaSolver(evaluator=predicted_quality(prob), trials=1, storage="memory")
        result = solver.solve(prob)  # one trial: the proportional anchor
        assert strategy_choices(result.strategy, prob) == strategy_choices(
            get_solver("proportional").solve(prob).strategy, prob
        )


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "settings, message",
    [
        ({"trials": 0}, "trials: must be >= 1"),
        ({"jobs": 0}, "jobs: must be >= 1"),
        ({"objectives": "memory"}, "objectives: 'memory' is not one of"),
        ({"space": "grid"}, "space: 'grid' is not one of"),
        ({"min_budget_share": 0}, "min_budget_share: must be in"),
        ({"study_name": "a/b"}, "study_name: use letters"),
        ({"storage": " "}, "storage: empty"),
        ({"samples": 0}, "samples: must be >= 1"),
        ({"tasks": ","}, "tasks: no task given"),
        ({"bogus": 1}, "unknown setting"),
    ],
)
def test_bad_settings_are_one_line_errors(settings, message):
    with pytest.raises(SolverError, match=message) as err:
        OptunaSolver(**settings)
    assert "\n" not in str(err.value)


def test_bad_inputs_at_solve_time_are_one_line_errors(loaded, tmp_path):
    prob = problem()
    cases = [
        (
            OptunaSolver(
                loaded_model=loaded,
                tasks="ruler/nope",
                storage="memory",
                **{k: v for k, v in RUNTIME.items() if k != "tasks"},
            ),
            "tasks:",
        ),
        (OptunaSolver(loaded_model=loaded, storage=str(tmp_path), **RUNTIME), "is a directory"),
        (
            OptunaSolver(loaded_model=(tiny_model("llama", layers=2), loaded[1]), storage="memory", **RUNTIME),
            "has 2 layers",
        ),
        (OptunaSolver(evaluator=lambda s: "bad", storage="memory"), "quality must be a number"),
    ]
    for solver, message in cases:
        with pytest.raises(SolverError, match=message) as err:
            solver.solve(prob)
        assert "\n" not in str(err.value)
    with pytest.raises(SolverError, match="needs a signal table"):
        OptunaSolver(evaluator=lambda s: 0.0).solve(Problem(global_budget=16, num_layers=3))
    with pytest.raises(SolverError, match="either evaluator= or loaded_model="):
        OptunaSolver(evaluator=lambda s: 0.0, loaded_model=loaded)


def test_kl_degradation_drives_the_rule_rank_and_the_anchors():
    prob = problem(L=4, seed=2)
    solver = OptunaSolver(evaluator=predicted_quality(prob), trials=3, storage="memory", degradation="kl")
    result = solver.solve(prob)
    anchors = {t.user_attrs["anchor"]: t for t in solver.study.trials if "anchor" in t.user_attrs}
    assert anchors["ilp"].params["ilp_objective"] == "kl"
    assert trial_choices(anchors["ilp"], prob) == strategy_choices(
        get_solver("ilp", objective="kl").solve(prob).strategy, prob
    )
    assert anchors["uniform-best"].params["uniform_pattern"] == best_uniform_pattern(prob, "kl")[0]
    assert result.strategy.provenance["optuna"]["uniform_best"]["degradation"] == "kl"
    assert set(result.unused_budget) == set(PHASES)
