"""``duo``: the DuoAttention baseline (Xiao et al. 2410.10819) from measured retrieval-head scores.

The ``k`` KV heads with the highest retrieval score (the signal table's ``heads.retrieval.mean``,
``collect --retrieval-heads``; ties to the lower layer, then head) keep the whole context: pattern
``full`` with budget n (the context length, :func:`solvers.heads.context_length`). Every other KV head
is a streaming head: ``streaming_llm`` with ``n_sink`` sinks + recent tokens, all at one budget s.

Fitting k and s to B. With H KV heads per layer, N = L·H heads, the total T = H·floor(L·B) (so the
layers' mean budgets sum to at most floor(L·B), the total of every layer-level solver) and the floor
of a streaming head f = max(b_min, min(n_sink + min_recent, floor(B))) (so at B below
n_sink + min_recent no head can be full and every head streams at about B)::

    k = the largest integer with  k·n + (N − k)·f <= T      (the streaming heads still get f each)
    s = floor((T − k·n) / (N − k))                            (what is left, split evenly; s < n)

so k is as large as B allows and the streaming heads get everything left (at most N − k tokens unused).
``full_heads=K`` fixes k instead (refused when the streaming heads would get less than f). When
``N·n <= T`` every head keeps everything. DuoAttention's own split (25 % / 50 % of heads full) comes
from training gates at long contexts; here k follows from B, and B decides how many heads can be full.
Both phases get the same heads (decoding follows prefill's: a full head keeps its generated tokens),
also when the table has prefill only (:mod:`solvers.heads`, "Phases the table lacks").

``keep="prompt"``: a retrieval head keeps the whole prompt for good and the newest ``recent`` tokens beside
it, instead of everything: ``evidence[rule=streaming_llm]`` at budget ``n + recent`` whose share holds the
``n - 4`` prompt tokens past streaming_llm's 4 sinks (``floor(share * (n + recent)) = n - 4``; the rule keeps
the sinks and the newest ``recent``), so a long generation streams through its recent window and never pushes
the prompt's facts out, and the head holds at most its budget however long the generation (a ``full`` head
grows by every generated token). ``k`` and ``s`` are fitted as above with
``n + recent`` in place of ``n``. Built for the decode suite's recall tasks (docs/decode.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from polykv_search.patterns.streaming_llm import StreamingLLM
from solvers.base import Plan, Problem, Settings, Solver, SolverError, setting
from solvers.heads import context_length, grouped_plan, head_total, retrieval_scores, target_context_setting

#: What a retrieval head keeps (``DuoSettings.keep``).
KEEP = ("all", "prompt")


def prompt_share(n: int, recent: int) -> float:
    """The smallest share, to 6 decimals, with ``floor(share * (n + recent)) == n - sinks`` (``sinks``: the inner
    streaming_llm's, which it keeps itself): the share holds every other prompt token, the rule the sinks and
    the newest ``recent`` tokens."""
    held = n - StreamingLLM().n_sink
    share = math.ceil(1e6 * held / (n + recent)) / 1e6
    assert math.floor(share * (n + recent)) == held, (n, recent)
    return share


@dataclass(frozen=True)
class DuoSettings(Settings):
    n_sink: int = setting(4, "sink tokens of every streaming head (streaming_llm's n_sink)")
    min_recent: int = setting(60, "recent tokens a streaming head gets at least; with n_sink the floor k is fitted to")
    full_heads: int | None = setting(None, "number of KV heads that keep everything (default: the most B allows)")
    keep: str = setting(
        "all",
        "what a retrieval head keeps: all (every token, DuoAttention) or prompt (the whole prompt for good and the "
        "newest --recent tokens, a budget of n + recent that a long generation cannot outgrow)",
    )
    recent: int = setting(64, "keep=prompt: the newest tokens a retrieval head keeps beside the prompt")
    target_context_len: int | None = target_context_setting()

    def check(self) -> None:
        if self.n_sink < 0:
            raise SolverError(f"n_sink: must be >= 0, got {self.n_sink}")
        if self.min_recent < 1:
            raise SolverError(f"min_recent: must be >= 1, got {self.min_recent}")
        if self.full_heads is not None and self.full_heads < 0:
            raise SolverError(f"full_heads: must be >= 0, got {self.full_heads}")
        if self.keep not in KEEP:
            raise SolverError(f"keep: must be one of {', '.join(KEEP)}, got {self.keep!r}")
        if self.recent < 1:
            raise SolverError(f"recent: must be >= 1, got {self.recent}")
        if self.target_context_len is not None and self.target_context_len < 1:
            raise SolverError(f"target_context_len: must be >= 1, got {self.target_context_len}")


def fit(num_heads: int, total: int, n: int, floor: int, full_heads: int | None = None) -> tuple[int, int | None]:
    """``(k, s)`` of the module docstring (``s`` is None when every head is full)."""
    if num_heads * n <= total and full_heads in (None, num_heads):
        return num_heads, None
    if floor >= n:
        raise SolverError(f"infeasible: a streaming head's floor {floor} is not below the context length {n}")
    if num_heads * floor > total:
        raise SolverError(
            f"infeasible: {num_heads} KV heads at the streaming floor {floor} need {num_heads * floor} tokens "
            f"> H*floor(L*B) = {total}; lower --min-recent or raise B"
        )
    k_max = min(num_heads - 1, (total - num_heads * floor) // (n - floor))
    if full_heads is not None:
        if full_heads > k_max:
            raise SolverError(
                f"full_heads: {full_heads} full KV heads leave the streaming heads less than {floor} tokens each "
                f"at this B (at most {k_max})"
            )
        k_max = full_heads
    return k_max, (total - k_max * n) // (num_heads - k_max)


class DuoSolver(Solver):
    name = "duo"
    description = (
        "DuoAttention baseline: top-k retrieval heads keep everything, the rest sinks + recent (k fitted to B)"
    )
    needs_table = True
    Settings = DuoSettings
    settings: DuoSettings

    def _solve(self, problem: Problem) -> Plan:
        s = self.settings
        scores = retrieval_scores(problem.table, self.name)
        L, H = scores.shape
        n = context_length(problem, s.target_context_len, self.name)
        floor = max(problem.b_min, min(s.n_sink + s.min_recent, int(problem.global_budget)))
        total = head_total(problem, H)
        kept: tuple[str, int, dict[str, Any]] = ("full", n, {})
        if s.keep == "prompt":
            kept = ("evidence", n + s.recent, {"share": prompt_share(n, s.recent), "rule": "streaming_llm"})
        k, budget = fit(L * H, total, kept[1], floor, s.full_heads)
        order = np.lexsort((np.arange(L * H), -scores.reshape(-1)))  # score descending, then (layer, head)
        full = np.zeros(L * H, dtype=bool)
        full[order[:k]] = True
        stream = ("streaming_llm", budget or 0, {"n_sink": s.n_sink})  # budget None: no head streams
        per_head = [[kept if full[l * H + h] else stream for h in range(H)] for l in range(L)]
        spent = k * kept[1] + (L * H - k) * (budget or 0)
        what = f"all {n} tokens" if s.keep == "all" else f"the {n}-token prompt and {s.recent} recent tokens"
        message = (
            f"{k} of {L * H} KV heads keep {what} (top retrieval scores), the rest streaming_llm at "
            f"{budget} (n_sink {s.n_sink}); mean budget {spent / (L * H):.4g} of B = {problem.global_budget:g}"
        )
        info: dict[str, Any] = {
            "full_heads": k,
            "streaming_budget": budget,
            "floor": floor,
            "context_len": n,
            "heads_total": total,
        }
        info |= {"keep": s.keep, "retrieval_head_budget": kept[1]}
        rule = "k = max with k*b + (N-k)*f <= H*floor(L*B), b = n (keep=all) or n + recent (keep=prompt); "
        rule += "s = floor((H*floor(L*B) - k*b)/(N-k))"
        provenance = {"granularity": "head", "context_len": n, "duo": {**info, "rule": rule}}
        return grouped_plan(problem, per_head, n, message=message, info=info, provenance=provenance)
