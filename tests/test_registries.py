"""Every pattern, solver and exporter is exercised by looping over its registry.

The parametrizations below are derived from the registries (``polykv_search.patterns.PATTERNS``,
``solvers.list_methods()``, ``strategies.exporters.EXPORTERS``), so a new entry is tested the moment
it is registered, and fails here until it has what these checks need: a slow reference in the test
oracle (patterns), a way to run without a model (solvers), a reader for its output (exporters).
The runtime's per-pattern oracle comparison (tests/test_runtime.py) loops over the same registry.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from polykv_search.patterns import PATTERNS
from signals import random_signal_table
from solvers import Problem, get_solver_class, list_methods
from solvers.base import predict_degradation
from strategies import PHASES, LayerChoice, Strategy
from strategies.exporters import EXPORTERS, ExportOptions, export_strategy, get_exporter
from strategies.kvpress_presses import decoding_press, prefill_press
from strategies.kvpress_sidecar import read_export
from tests.head_tables import random_heads
from tests.oracle_select import DEFAULTS as ORACLE_DEFAULTS

# ------------------------------------------------------------------------------------ patterns
PATTERN_NAMES = list(PATTERNS)
EVICTING_PATTERNS = [name for name, cls in PATTERNS.items() if not cls.keeps_all]


def test_the_registry_keys_are_the_patterns_own_names():
    assert PATTERN_NAMES and all(cls.name == name for name, cls in PATTERNS.items())
    assert "full" in PATTERNS and PATTERNS["full"].keeps_all


@pytest.mark.parametrize("name", PATTERN_NAMES)
def test_every_pattern_has_an_oracle_reference_with_the_same_defaults(name):
    """tests/oracle_select.py decides evictions with its own slow reference of each pattern; it must know
    every registered pattern, with the literature defaults the pattern class declares."""
    assert name in ORACLE_DEFAULTS, f"add a slow reference of {name!r} to tests/oracle_select.py (DEFAULTS and evict)"
    assert ORACLE_DEFAULTS[name] == PATTERNS[name]().params()


@pytest.mark.parametrize("name", PATTERN_NAMES)
def test_every_pattern_round_trips_through_strategy_json(name, tmp_path):
    s = Strategy.uniform(3, name, 12)
    back = Strategy.load(s.save(tmp_path / "s.json"))
    assert back.to_json() == s.to_json()
    assert back.patterns("prefill") == [name] * 3


@pytest.mark.parametrize("name", PATTERN_NAMES)
def test_every_pattern_has_a_kvpress_counterpart(name):
    choice = LayerChoice(name, 8)
    press = prefill_press(choice)
    assert (press is None) == PATTERNS[name].keeps_all
    dec, dropped = decoding_press(choice)
    assert dec is not None or dropped is not None or PATTERNS[name].keeps_all


# ------------------------------------------------------------------------------------- solvers
SOLVER_NAMES = [m.name for m in list_methods()]
SOLVER_PATTERNS = ("snapkv", "tova", "h2o", "streaming_llm")


def predicted_quality(problem: Problem):
    """A cheap, deterministic trial score (minus the table's predicted ΔPPL) instead of a model."""
    return lambda strategy: -predict_degradation(problem.table, strategy, problem.phases, "dppl")


def predicted_kl(problem: Problem):
    """Six per-sample values of a strategy (its predicted ΔPPL plus a fixed offset per sample) instead of a model."""
    offsets = np.linspace(0.0, 0.5, 6)
    return lambda strategies: np.stack(
        [predict_degradation(problem.table, s, problem.phases, "dppl") + offsets for s in strategies], 1
    )


#: What a solver needs, beyond its default settings, to run here without a model. A new solver that
#: cannot run on a signal table alone fails below until it gets an entry (its full tests live in its
#: own file; see CONTRIBUTING.md).
RUN_WITHOUT_A_MODEL = {
    "optuna": lambda problem: {"evaluator": predicted_quality(problem), "trials": 3, "storage": "memory"},
    "search": lambda problem: {
        "evaluator": predicted_kl(problem),
        "kinds": ["prose"] * 3 + ["evidence"] * 3,
        "max_evaluations": 12,
        "progress": False,
    },
    "pool-prior": lambda problem: {"evaluator": prior_spread, "kinds": ["prose"] * 3 + ["evidence"] * 3},
}


def prior_spread(strategies):
    """Six per-sample values of a strategy (how far its pool weights spread, plus a fixed offset per sample)."""
    spread = [sum(abs(np.log(float(c.params.get("weight", 1.0)))) for c in s.prefill) for s in strategies]
    return np.stack([np.linspace(0.0, 0.5, 6) + x for x in spread], 1)


def test_every_solver_is_listed():
    assert {"proportional", "uniform"} <= set(SOLVER_NAMES)
    assert set(RUN_WITHOUT_A_MODEL) <= set(SOLVER_NAMES), "RUN_WITHOUT_A_MODEL names a solver that is gone"


@pytest.mark.parametrize("name", SOLVER_NAMES)
def test_every_solver_returns_a_feasible_deterministic_strategy(name):
    method = next(m for m in list_methods() if m.name == name)
    if not method.available:
        pytest.skip(f"{name}: {method.reason}")
    table = random_signal_table(5, budgets=(8, 16, 32, 64), patterns=SOLVER_PATTERNS, seed=3)
    table.set_heads(random_heads(5, 3, seed=3))  # retrieval-head scores, for the head-level baselines
    problem = Problem(global_budget=24, table=table, b_min=4, seed=0)
    extra = RUN_WITHOUT_A_MODEL.get(name, lambda problem: {})

    def run():
        return get_solver_class(name)(**extra(problem)).solve(problem)

    result = run()
    s = result.strategy
    assert result.solver == name and s.num_layers == 5
    assert Strategy.from_json(s.to_json()).to_json() == s.to_json()  # validates
    for phase in PHASES:
        budgets = s.budgets(phase)
        number = (int, float) if s.has_head_groups else int  # head groups: a layer's mean over its KV heads
        assert all(isinstance(b, number) and b >= problem.b_min for b in budgets)
        assert sum(budgets) <= problem.total + 1e-9
    assert run().strategy.to_json()["layers"] == s.to_json()["layers"]


# ----------------------------------------------------------------------------------- exporters
FORMATS = list(EXPORTERS)


def _trtllm_windows(main: Path) -> list[int | None]:
    yaml = pytest.importorskip("yaml")
    return list(yaml.safe_load(main.read_text())["kv_cache_config"]["max_attention_window"])


def _vllm_windows(main: Path) -> list[int | None]:
    doc = json.loads(main.read_text())
    return [doc["sliding_window"] if t == "sliding_attention" else None for t in doc["layer_types"]]


#: format -> how to read its main output back as the per-layer prefill budgets (windows) it holds.
#: A new exporter fails below until it has a reader here.
READ_BACK = {
    "json": lambda main: Strategy.load(main).budgets("prefill"),
    "kvpress": lambda main: [layer["prefill"]["budget"] for layer in read_export(main)["layers"]],
    "trtllm": _trtllm_windows,
    "vllm": _vllm_windows,
}


def test_every_exporter_has_a_reader_here():
    assert set(READ_BACK) == set(FORMATS), "READ_BACK must name exactly the registered formats"


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_exporter_writes_what_it_was_given(fmt, tmp_path):
    exporter = get_exporter(fmt)
    assert exporter.name == fmt and exporter.description and "\n" not in exporter.description
    assert exporter.uses <= {f.name for f in fields(ExportOptions)}
    # sliding windows without sinks: a strategy every target can express exactly
    strategy = Strategy.uniform(4, "streaming_llm", 32, params={"n_sink": 0})
    options = ExportOptions(max_seq_len=4096 if "max_seq_len" in exporter.uses else None)
    out = tmp_path / f"out{exporter.suffix or '.txt'}"
    export = export_strategy(strategy, fmt, out, options)
    assert export.main == out and not export.warnings
    for path in export.files:
        assert path.is_file() and path.read_text(encoding="utf-8").strip()
    assert READ_BACK[fmt](out) == [32] * 4
