"""A Problem holds what its constructor derives: the types the solvers read (and mypy checks) are the ones it has."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from signals import random_signal_table
from solvers import Problem, SolverError
from solvers.result import Plan
from strategies import LayerChoice


def test_the_constructor_takes_none_or_one_value_and_holds_the_normalized_fields():
    p = Problem(num_layers=np.int64(4), global_budget=8, b_min=np.int64(2), phases="prefill", budgets=16)
    assert (p.num_layers, p.b_min, p.global_budget) == (4, 2, 8.0)
    assert type(p.num_layers) is int and type(p.b_min) is int and type(p.global_budget) is float
    assert (p.phases, p.budgets, p.patterns) == (("prefill",), (16,), None)
    q = Problem(num_layers=4, global_budget=8, phases=["decoding", "prefill"], patterns="snapkv", budgets=[32, 16, 32])
    assert (q.phases, q.patterns, q.budgets) == (("prefill", "decoding"), ("snapkv",), (16, 32))


def test_a_table_gives_the_layers_phases_grid_and_patterns_when_none_are_named():
    table = random_signal_table(3, budgets=[8, 16], seed=0, patterns=("snapkv", "tova"))
    p = Problem(table=table, global_budget=12)
    assert (p.num_layers, p.phases, p.budgets) == (3, tuple(table.phases), (8, 16))
    assert p.patterns == p.allowed_patterns("ilp") == ("snapkv", "tova")


def test_replace_checks_again_and_keeps_the_other_fields():
    p = Problem(num_layers=4, global_budget=8, budgets=[8, 16], patterns=["tova"])
    q = dataclasses.replace(p, budgets=(8,))
    assert q == Problem(num_layers=4, global_budget=8, budgets=[8], patterns=["tova"])
    with pytest.raises(SolverError, match="b_min"):
        dataclasses.replace(p, b_min=0)


def test_allowed_patterns_without_a_table_or_patterns_is_a_solver_error():
    with pytest.raises(SolverError, match="'optuna' needs the allowed patterns"):
        Problem(num_layers=4, global_budget=8).allowed_patterns("optuna")


def test_plan_pairs_are_the_layer_level_choices_and_a_head_level_plan_has_none():
    assert Plan({"prefill": [("snapkv", 8), ("tova", 4)]}).pairs("prefill") == [("snapkv", 8), ("tova", 4)]
    grouped = Plan({"prefill": [LayerChoice("snapkv", 8)]})
    with pytest.raises(TypeError, match="head-level"):
        grouped.pairs("prefill")
