"""The pattern–layer boundary is checked, not prose: every registered pattern runs against a view that raises on
anything outside :class:`~polykv_search.patterns.base.LayerView` (tests/strict_view.py), in every layout the
runtime builds — one layer per model layer, head groups, a pooled allocation's per-head groups, the scorer's
shared context call (fan-out) and its row batches (whole and split), and the signal replay's row batch —
through prefill, a reconstruction pass (kvzip) and decoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from polykv_search import scoring
from polykv_search.patterns import PATTERNS, LayerView, Pattern, PatternState, make_pattern, parse_spec
from polykv_search.runtime import FULL_PLAN, EvictingLayer, PhasePlan, apply_strategy, strategy_plans
from polykv_search.runtime.layouts import HeadGroupPlan
from polykv_search.scoring.shared import SharedScorer
from signals.collect import collect_signals
from strategies import Strategy
from tests.strict_view import LAYER_VIEW_NAMES, OutsideLayerView, StrictView, checked_patterns
from tests.test_collect import make_samples
from tests.test_eval_support import char_tokenizer
from tests.test_runtime import batch
from tests.test_scoring_engines import jobs
from tests.tiny import tiny_model

L = 2
BUDGET = 10


def test_the_strict_view_shows_the_protocol_and_raises_on_anything_else():
    layer = EvictingLayer(0, FULL_PLAN, FULL_PLAN, num_kv_heads=2, groups=2, scaling=0.5)
    layer.update(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))
    view = StrictView(layer)
    assert {"keys", "valid", "allowed", "row_counts", "scaling", "attention_probs"} <= LAYER_VIEW_NAMES
    assert view.length == 5 and view.scaling == 0.5 and view.row_counts() is None
    for outside in ("plans", "states", "calls", "store", "_keys", "device"):
        assert not hasattr(LayerView, outside)
        with pytest.raises(OutsideLayerView):
            getattr(view, outside)
    with pytest.raises(OutsideLayerView):
        view.seen = 3


@dataclass(frozen=True)
class Peeking(Pattern):
    """A pattern that reads a layer's plans, which LayerView does not declare."""

    name: ClassVar[str] = "test_peeking"

    def post_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        layer.plans  # type: ignore[attr-defined]  # noqa: B018

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        return layer.keys[..., 0].float()


def test_a_pattern_reading_outside_the_protocol_fails_under_the_check(monkeypatch):
    monkeypatch.setitem(PATTERNS, Peeking.name, Peeking)
    checked_patterns(monkeypatch)
    assert type(make_pattern("snapkv")).__name__ == "CheckedSnapKV"
    model = tiny_model("llama", layers=L)
    ids, _ = batch(seed=1, n=30, pad=0)
    with apply_strategy(model, Strategy.uniform(L, Peeking.name, BUDGET)), torch.no_grad():
        with pytest.raises(OutsideLayerView, match="plans"):
            model(ids, use_cache=True)
    monkeypatch.setitem(PATTERNS, Peeking.name, Peeking)  # unchecked, the same pattern runs
    with apply_strategy(model, Strategy.uniform(L, Peeking.name, BUDGET)), torch.no_grad():
        model(ids, use_cache=True)


def _head_groups(pattern: str, heads: int) -> dict[int, list[HeadGroupPlan]]:
    plan = PhasePlan(make_pattern(pattern), BUDGET)
    return {0: [HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN), *(HeadGroupPlan((h,), plan, plan) for h in range(1, heads))]}


def _every_pattern_spec(names: list[str]) -> list[str]:
    """Every registered pattern, with kvzip's pooled allocations beside its per-head one."""
    return [n for n in names if n != "full"] + ["kvzip[allocation=layer]", "kvzip[allocation=model]"]


def _strategy(spec: str, budget: int = BUDGET) -> Strategy:
    name, params = parse_spec(spec)
    return Strategy.uniform(L, name, budget, params=params)


def test_every_pattern_stays_inside_the_view_in_the_runtime_layouts(monkeypatch):
    """A strategy's own cache (a layer per model layer; a pooled allocation's per-head groups) and head groups,
    under generate() with left padding: prefill, the reconstruction pass, decoding."""
    names = checked_patterns(monkeypatch)
    model = tiny_model("llama", layers=L, seed=3)
    ids, mask = batch(seed=4, n=28, pad=5)
    for spec in _every_pattern_spec(names):
        with apply_strategy(model, _strategy(spec)), torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    heads = model.config.num_key_value_heads
    for name in names:
        if name == "full":
            continue
        with apply_strategy(model, Strategy.full(L), head_groups=_head_groups(name, heads)), torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)


def test_every_pattern_stays_inside_the_view_in_the_scorer_layouts(monkeypatch):
    """The shared scorer: one fan-out context call for every entry (head-group entries included), then row
    batches, whole and split in parts, teacher-forced and generating."""
    names = checked_patterns(monkeypatch)
    model, tok = tiny_model("llama", layers=L, seed=5), char_tokenizer()
    specs = _every_pattern_spec(names)
    entries = [scoring.Entry(spec, _strategy(spec, 8 + i), "baseline", spec) for i, spec in enumerate(specs)]
    entries.append(scoring.Entry("full", Strategy.full(L), "baseline", "full"))
    heads = model.config.num_key_value_heads
    grouped = [{} for _ in entries] + [_head_groups(n, heads) for n in names if n != "full"]
    full = strategy_plans(Strategy.full(L))
    plans = [strategy_plans(e.strategy) for e in entries] + [full] * (len(grouped) - len(entries))
    for job in jobs(tok, n=40):
        for split in (None, 1):
            with apply_strategy(model, Strategy.full(L)) as rt:
                SharedScorer(model, rt, plans, head_groups=grouped, split=split, batch_entries=6).run(job)


def test_every_pattern_stays_inside_the_view_in_the_signal_replay(monkeypatch):
    """The collector's replay: forked rows, its row batch, and kvzip's reconstruction states."""
    names = checked_patterns(monkeypatch)
    model = tiny_model("llama", layers=L, seed=7)
    samples = make_samples(1, n=24, m=4, seed=8)
    collect_signals(model, samples, patterns=[n for n in names if n != "full"], budgets=[6, 14], journal=False)


def test_the_check_covers_every_registered_pattern():
    assert set(PATTERNS) >= {"snapkv", "h2o", "tova", "kvzip", "expected_attention", "keydiff"}
