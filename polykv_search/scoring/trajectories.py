"""Trajectory jobs (the decode suite) on the shared engine: FullKV as one more row, samples batched together.

Today's reference path (:meth:`SharedScorer._run_trajectory <polykv_search.scoring.shared.SharedScorer>`,
``fullkv_apart=True``) greedy-decodes FullKV's N tokens alone, one token per call, then teacher-forces the
entries along them. Both halves feed the same token at the same step: step t feeds trajectory token t-1 to
FullKV (whose logits pick token t) and to every entry. So FullKV can be a row of the entries' batch, its
next-token choice made between two calls, and the separate N-call generation disappears.

Samples whose prompts have the same length (every ``decode/trajectory`` sample has ``context_len`` tokens)
also share the batch: each sample has its own context call (one :func:`~polykv_search.runtime.fanout_layer`
pass, as before), then all their rows (each sample's entries and its FullKV row) are stacked and stepped
together, each row fed its own sample's token. Rows are independent in a batch, so every row keeps the
tokens it keeps alone; what the batch saves is the per-call cost (the weights read once per step for all
rows, the layers' Python and kernel-launch overhead, the eviction's per-group calls).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from polykv_search.evaluation.runner import _sync
from polykv_search.evaluation.trajectory import Trajectory, TrajectoryMeter, pick
from polykv_search.runtime import FULL_PLAN, cache_report
from polykv_search.scoring.job import SampleJob, SampleOutcome

if TYPE_CHECKING:
    from polykv_search.scoring.shared import SharedScorer


def batch_groups(jobs: Sequence[SampleJob], size: int) -> list[list[int]]:
    """Indices of trajectory ``jobs`` grouped for :func:`run_trajectories`: jobs with equal prompt and
    generation lengths (groups in order of first appearance), at most ``size`` per group."""
    if size < 1:
        raise ValueError(f"size must be positive, got {size!r}")
    by_length: dict[tuple[int, int], list[int]] = {}
    for i, job in enumerate(jobs):
        by_length.setdefault((len(job.context_ids), job.generate_len), []).append(i)
    return [idx[a : a + size] for idx in by_length.values() for a in range(0, len(idx), size)]


@torch.inference_mode()
def run_trajectories(scorer: SharedScorer, jobs: Sequence[SampleJob]) -> list[list[SampleOutcome]]:
    """Every entry's outcome on each of ``jobs`` (trajectory jobs whose prompts have one length), FullKV
    decoding as a row beside the entries and the jobs' rows stepped as one batch."""
    if not jobs or any(not job.trajectory for job in jobs):
        raise ValueError("run_trajectories takes one or more trajectory jobs")
    if len({(len(job.context_ids), job.generate_len) for job in jobs}) != 1:
        raise ValueError("the jobs of one trajectory batch need one prompt length (rows share positions) and N")
    dev = scorer.caller.device
    evicting = [i for i, is_full in enumerate(scorer.full_rows) if not is_full]
    full_plan = [(FULL_PLAN, FULL_PLAN)] * scorer.num_layers
    rows, firsts, context_s = [], [], []
    for job in jobs:  # per job: its evicting entries' rows, then its FullKV row (last)
        own = [scorer._row(scorer.plans[i], scorer.head_groups[i]) for i in evicting] + [scorer._row(full_plan)]
        t0 = time.perf_counter()
        firsts.append(scorer._context_call(job.context_ids, own))
        _sync(dev)
        context_s.append(time.perf_counter() - t0)
        rows.append(own)
    width = len(evicting) + 1
    n = jobs[0].generate_len
    t1 = time.perf_counter()
    trajectories = [Trajectory([0] * n, _logit_rows(firsts[j], n), [], None, {}) for j in range(len(jobs))]
    meters = [TrajectoryMeter(trajectories[j], width, job.eos) for j, job in enumerate(jobs)]
    # the batch: every job's evicting rows, then the FullKV rows, so that one cut (layouts.row_parts) parts the
    # long rows from the short ones; ``at[j]``: job j's rows in the batch, in its own order
    order = [(j, r) for j in range(len(jobs)) for r in range(width - 1)] + [(j, width - 1) for j in range(len(jobs))]
    last = (width - 1) * len(jobs)  # where the FullKV rows start
    at = [torch.tensor([*range(j * (width - 1), (j + 1) * (width - 1)), last + j]) for j in range(len(jobs))]
    cache = scorer._stacked([rows[j][r] for j, r in order])
    logits = torch.cat([firsts[j] for j, _ in order])  # [jobs * width, V]
    feed_last = any(job.limit > 0 for job in jobs)
    for t in range(n):
        for j, job in enumerate(jobs):
            mine = logits.index_select(0, at[j].to(logits.device))
            trajectory = trajectories[j]
            trajectory.logits[t] = mine[-1]
            trajectory.tokens[t] = int(pick(mine[-1:], job.eos)[0])
            meters[j].add(t, mine)
        if t + 1 < n or feed_last:
            logits = scorer._call([[trajectories[j].tokens[t]] for j, _ in order], cache)[:, -1]
    scorer._write_back(cache)
    _sync(dev)
    forced_s = (time.perf_counter() - t1) / len(jobs)
    out = []
    for j, job in enumerate(jobs):
        t2 = time.perf_counter()
        if job.limit > 0:
            mine = logits.index_select(0, at[j].to(logits.device))
            new, timing = scorer._decode(job, rows[j], scorer._stacked(rows[j]), mine)
        else:
            new, timing = [[] for _ in range(width)], {"question_s": 0.0}
        _sync(dev)
        timing = {
            "context_s": context_s[j],
            "question_s": timing["question_s"],
            "decode_s": forced_s + time.perf_counter() - t2 - timing["question_s"],
        }
        trajectories[j].answer_ids = list(new[-1])
        out.append(_outcomes(scorer, trajectories[j], meters[j], rows[j], new, timing, evicting))
    return out


def _logit_rows(first: torch.Tensor, n: int) -> torch.Tensor:
    """FullKV's next-token logits before each of the n trajectory tokens ``[n, V]`` (float32), to be filled."""
    return torch.empty(n, first.shape[-1], dtype=torch.float32, device=first.device)


def _outcomes(scorer, trajectory: Trajectory, meter: TrajectoryMeter, rows, new, timing, evicting) -> list:
    """One job's outcomes in the scorer's entry order: FullKV entries get the trajectory's exact outcome,
    its answer and its row's KV bytes; the others their own row's."""
    full = cache_report(rows[-1])
    outcomes: list[SampleOutcome | None] = [
        SampleOutcome(TrajectoryMeter.exact(trajectory), timing, full.kv_bytes, full.full_kv_bytes, list(new[-1]))
        if is_full
        else None
        for is_full in scorer.full_rows
    ]
    for j, i in enumerate(evicting):
        report = cache_report(rows[j])
        outcomes[i] = SampleOutcome(meter.outcome(j), timing, report.kv_bytes, report.full_kv_bytes, list(new[j]))
    return outcomes
