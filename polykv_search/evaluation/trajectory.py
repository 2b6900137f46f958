"""Trajectory fidelity: one FullKV greedy generation, every entry teacher-forced along it step by step.

:func:`full_trajectory` greedy-decodes N tokens with FullKV (end-of-sequence tokens banned, so every
trajectory has N tokens) and keeps FullKV's next-token logits at every position. An entry is then run
on the same prompt and fed the trajectory one token per call, exactly as generation feeds its own
tokens, so its decoding plan evicts step by step; :class:`TrajectoryMeter` records, per position t,
KL(FullKV ‖ entry) of the next-token distributions, top-1 agreement (the entry's greedy choice, under
the same ban, equals FullKV's token) and ΔNLL = NLL_entry − NLL_FullKV of FullKV's token, and averages
them per position bucket (``0-128``, ``128-256``, ...). Position 0 is predicted by the prompt call,
whose output no eviction changes, so every entry agrees with FullKV there.

With a question (``decode/recall``), the last trajectory token is fed too, then the question in one
call, then the entry answers greedily (:func:`answer`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polykv_search.evaluation.fidelity import log_probs, token_kl

#: Width of a position bucket (generated-token index), in tokens.
BUCKET = 128


def buckets(n: int, width: int | None = None) -> list[tuple[str, int, int]]:
    """``(name, start, stop)`` of the position buckets of an N-token trajectory: ``0-128``, ``128-256``, ...
    (``width`` default: :data:`BUCKET`)."""
    width = BUCKET if width is None else width
    return [(f"{lo}-{min(lo + width, n)}", lo, min(lo + width, n)) for lo in range(0, n, width)]


def pick(logits: torch.Tensor, banned: Sequence[int] | frozenset[int]) -> torch.Tensor:
    """Greedy choice over the last dimension with ``banned`` ids excluded (ties: the lowest id)."""
    ids = [b for b in banned if 0 <= b < logits.shape[-1]]
    if ids:
        logits = logits.clone()
        logits[..., ids] = float("-inf")
    return logits.argmax(dim=-1)


@dataclass
class Trajectory:
    """FullKV's run of one sample: the N generated tokens, its logits before each of them ``[N, V]``
    (float32), its answer ids (with a question), the cache it left and the calls' seconds."""

    tokens: list[int]
    logits: torch.Tensor
    answer_ids: list[int]
    cache: Any
    timing: dict[str, float]


class TrajectoryMeter:
    """Per-position fidelity of ``rows`` entries along one trajectory (float64)."""

    def __init__(self, trajectory: Trajectory, rows: int, banned: frozenset[int]):
        n = len(trajectory.tokens)
        self.trajectory = trajectory
        self.banned = banned
        self.kl = torch.zeros(rows, n, dtype=torch.float64)
        self.dnll = torch.zeros(rows, n, dtype=torch.float64)
        self.agree = torch.zeros(rows, n, dtype=torch.bool)

    def add(self, t: int, logits: torch.Tensor) -> None:
        """Record position ``t`` from the rows' next-token logits ``[rows, V]``."""
        ref = log_probs(self.trajectory.logits[t : t + 1].to(logits.device))  # [1, V]
        logp = log_probs(logits)
        token = self.trajectory.tokens[t]
        self.kl[:, t] = token_kl(ref, logp).cpu()
        self.dnll[:, t] = (ref[:, token] - logp[:, token]).cpu()
        self.agree[:, t] = (pick(logits, self.banned) == token).cpu()

    def outcome(self, row: int) -> dict[str, Any]:
        """Row ``row``'s prediction dict: totals, means and per-bucket means."""
        n = self.kl.shape[1]
        kl, dnll, agree = self.kl[row], self.dnll[row], self.agree[row].double()
        spans = buckets(n)
        return {
            "agree_tokens": int(self.agree[row].sum()),
            "total": n,
            "agree": float(100.0 * agree.mean()),
            "kl": float(kl.mean()),
            "dnll": float(dnll.mean()),
            "kl_buckets": {name: float(kl[a:b].mean()) for name, a, b in spans},
            "agree_buckets": {name: float(100.0 * agree[a:b].mean()) for name, a, b in spans},
            "dnll_buckets": {name: float(dnll[a:b].mean()) for name, a, b in spans},
        }

    @staticmethod
    def exact(trajectory: Trajectory) -> dict[str, Any]:
        """FullKV's own outcome: agreement 100 %, KL and ΔNLL 0 everywhere."""
        n = len(trajectory.tokens)
        spans = buckets(n)
        return {
            "agree_tokens": n,
            "total": n,
            "agree": 100.0,
            "kl": 0.0,
            "dnll": 0.0,
            "kl_buckets": {name: 0.0 for name, _, _ in spans},
            "agree_buckets": {name: 100.0 for name, _, _ in spans},
            "dnll_buckets": {name: 0.0 for name, _, _ in spans},
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def full_trajectory(
    caller,
    context_ids: Sequence[int],
    n: int,
    banned: frozenset[int],
    question_ids: Sequence[int] = (),
    limit: int = 0,
) -> Trajectory:
    """FullKV greedy generation of ``n`` tokens (``banned`` ids excluded) with the model as it runs
    (under a FullKV runtime or none); with ``limit > 0`` it then feeds the last token and
    ``question_ids`` and answers greedily (the answer stops at a banned id)."""
    dev = caller.device
    t0 = time.perf_counter()
    out = caller.prefill(context_ids)
    cache, logits = out.cache, out.logits[:, -1]
    _sync(dev)
    t1 = time.perf_counter()
    tokens: list[int] = []
    rows = torch.empty(n, logits.shape[-1], dtype=torch.float32, device=logits.device)
    for t in range(n):
        rows[t] = logits[0]
        tokens.append(int(pick(logits, banned)[0]))
        if t + 1 < n or limit > 0:
            out = caller.extend([tokens[-1]], cache)
            cache, logits = out.cache, out.logits[:, -1]
    answer_ids: list[int] = []
    if limit > 0:
        step = lambda ids: caller.extend(ids, cache).logits[:, -1]  # noqa: E731
        answer_ids = answer(step, question_ids, logits, limit, banned)
    _sync(dev)
    timing = {"context_s": t1 - t0, "question_s": 0.0, "decode_s": time.perf_counter() - t1}
    return Trajectory(tokens, rows, answer_ids, cache, timing)


def force(step: Callable[[list[int]], torch.Tensor], first: torch.Tensor, meter: TrajectoryMeter, *, feed_last: bool):
    """Teacher-force the trajectory: ``first`` ``[rows, V]`` predicts position 0, ``step([token])`` feeds
    one token to every row and returns their next-token logits. Returns the logits after the last
    token when ``feed_last`` (for a question), else None."""
    tokens = meter.trajectory.tokens
    meter.add(0, first)
    for t in range(1, len(tokens)):
        meter.add(t, step([tokens[t - 1]]))
    return step([tokens[-1]]) if feed_last else None


def answer(
    step: Callable[[list[int]], torch.Tensor],
    question_ids: Sequence[int],
    logits: torch.Tensor,
    limit: int,
    eos: frozenset[int],
) -> list[int]:
    """One row's question call and greedy answer: ``step(ids)`` feeds ids and returns ``[1, V]`` logits."""
    if question_ids:
        logits = step(list(question_ids))
    new: list[int] = []
    for i in range(limit):
        token = int(logits.argmax(dim=-1)[0])
        if token in eos:
            break
        new.append(token)
        if i + 1 < limit:
            logits = step([token])
    return new


@torch.inference_mode()
def forced_run(
    caller, trajectory: Trajectory, context_ids: Sequence[int], banned: frozenset[int], question_ids=(), limit=0
) -> tuple[dict[str, Any], list[int], dict[str, float]]:
    """One entry along ``trajectory`` with the model as it runs (inside the entry's ``apply_strategy``):
    its prediction dict, its answer ids (with ``limit > 0``) and the calls' seconds."""
    dev = caller.device
    meter = TrajectoryMeter(trajectory, 1, banned)
    t0 = time.perf_counter()
    out = caller.prefill(context_ids)
    cache = out.cache
    _sync(dev)
    t1 = time.perf_counter()
    step = lambda ids: caller.extend(ids, cache).logits[:, -1]  # noqa: E731
    last = force(step, out.logits[:, -1], meter, feed_last=limit > 0)
    new = answer(step, question_ids, last, limit, banned) if limit > 0 else []
    _sync(dev)
    timing = {"context_s": t1 - t0, "question_s": 0.0, "decode_s": time.perf_counter() - t1}
    return meter.outcome(0), new, timing
