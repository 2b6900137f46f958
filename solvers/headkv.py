"""``headkv``: per-KV-head budgets in proportion to retrieval score, with a floor (HeadKV, Fu et al. 2410.19258).

HeadKV gives every head a base budget and shares a pool out in proportion to each head's importance
score. Here the score is the measured retrieval score s_{l,h} (the signal table's
``heads.retrieval.mean``, ``collect --retrieval-heads``), and with N = L·H heads, T = H·floor(L·B)
(the layers' mean budgets then sum to at most floor(L·B)) and the floor f = max(b_min,
floor(floor_share·B))::

    b_{l,h} = f + (T − N·f) · s_{l,h} / Σ s          capped at the context length n,

what a cap cuts off goes to the uncapped heads by the same shares (a water level), then
largest-remainder rounding to integers summing to T exactly (ties to the lower (layer, head) index;
:func:`solvers.allocation.allocate`). All scores 0: an even split. Every head uses one ``pattern``
(default snapkv; streaming_llm is the other natural choice); a head at n keeps everything. Heads of a
layer with equal budgets share a group; both phases get the same heads, also when the table has
prefill only (:mod:`solvers.heads`, "Phases the table lacks").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polykv_search.patterns import PATTERNS
from solvers.allocation import allocate
from solvers.base import Plan, Problem, Settings, Solver, SolverError, setting
from solvers.heads import context_length, grouped_plan, head_total, retrieval_scores, target_context_setting


@dataclass(frozen=True)
class HeadKVSettings(Settings):
    pattern: str = setting("snapkv", "pattern of every KV head")
    floor_share: float = setting(0.25, "every KV head gets at least floor(floor_share*B) tokens (and b_min)")
    target_context_len: int | None = target_context_setting()

    def check(self) -> None:
        if self.pattern not in PATTERNS or self.pattern == "full":
            raise SolverError(f"pattern: {self.pattern!r} is not a budgeted pattern; known: {', '.join(PATTERNS)}")
        if not 0 <= self.floor_share <= 1:
            raise SolverError(f"floor_share: must be in [0, 1], got {self.floor_share:g}")
        if self.target_context_len is not None and self.target_context_len < 1:
            raise SolverError(f"target_context_len: must be >= 1, got {self.target_context_len}")


class HeadKVSolver(Solver):
    name = "headkv"
    description = "HeadKV baseline: per-KV-head budgets in proportion to retrieval score, above a floor"
    needs_table = True
    Settings = HeadKVSettings
    settings: HeadKVSettings

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        scores = retrieval_scores(problem.table, self.name)
        L, H = scores.shape
        n = context_length(problem, s.target_context_len, self.name)
        total = head_total(problem, H)
        floor = min(max(problem.b_min, int(math.floor(s.floor_share * problem.global_budget + 1e-9))), n)
        if L * H * floor > total:
            raise SolverError(f"infeasible: {L * H} KV heads at the floor {floor} exceed H*floor(L*B) = {total}")
        budgets = allocate(total, weights=scores.reshape(-1), base=floor, lo=floor, hi=n).reshape(L, H)
        per_head: list[list[tuple[str, int, dict[str, Any]]]] = [
            [(s.pattern, int(budgets[l, h]), {}) for h in range(H)] for l in range(L)
        ]
        top = divmod(int(budgets.argmax()), H)
        message = (
            f"{s.pattern} per KV head: floor {floor}, budgets {int(budgets.min())}..{int(budgets.max())} "
            f"(largest L{top[0]}H{top[1]}), {int((budgets >= n).sum())} heads keep all {n}; mean "
            f"{budgets.mean():.4g} of B = {problem.global_budget:g}"
        )
        info = {"floor": floor, "context_len": n, "heads_total": total, "max_budget": int(budgets.max())}
        rule = "b = f + (H*floor(L*B) - N*f) * s/sum(s), capped at n (water level), largest-remainder rounding"
        provenance = {"granularity": "head", "context_len": n, "headkv": {**info, "rule": rule}}
        return grouped_plan(problem, per_head, n, message=message, info=info, provenance=provenance)
