"""The shared engine: one FullKV context pass per sample, then the entries batched (docs/design.md §6b).

Compression happens after each layer's kernel, so the context call's hidden states, logits and
per-layer prompt K/V are the same for every entry. One context call therefore serves them all: a
:func:`~polykv_search.runtime.fanout_layer` per layer hands every entry's row the prompt's keys and
values, runs each distinct pattern's hooks once, and compresses each row with its own prefill plan.
The question call and greedy decoding (or the teacher-forced continuation) of the entries then run as
one batch per group (:func:`plan_groups`), through row batches (:func:`~polykv_search.runtime.layouts.row_batch`): rows
hold different per-layer lengths in one padded store, and the rows that share a decoding pattern score
and evict together, each to its own budget. A layer may hold the batch in parts sharing the forward
(:func:`~polykv_search.runtime.layouts.row_parts`): a long row (FullKV) in a row batch of its own length,
the rows of one head split in a row batch per head set (:mod:`~polykv_search.scoring.stacking`). Rows that
emit EOS leave the batch. Every row keeps exactly the tokens the per-entry path keeps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from polykv_search.evaluation.fidelity import continuation_outcome, log_probs
from polykv_search.evaluation.runner import _Caller, _sync
from polykv_search.evaluation.trajectory import TrajectoryMeter, force, full_trajectory
from polykv_search.runtime import (
    FULL_PLAN,
    PhasePlan,
    PolyKVCache,
    RuntimeLayer,
    cache_report,
    fanout_layer,
)
from polykv_search.runtime.layouts import SPLIT_MIN_SAVING, HeadGroupPlan, cache_layer, layer_slots
from polykv_search.runtime.reconstruction import needs_pass
from polykv_search.scoring.job import SampleJob, SampleOutcome
from polykv_search.scoring.stacking import stacked_layer
from polykv_search.scoring.trajectories import batch_groups, run_trajectories

Plans = Sequence[tuple[PhasePlan, PhasePlan]]


def plan_groups(
    lengths: Sequence[Sequence[int]], max_rows: int, fixed_cost: float, split: int | None = None
) -> list[list[int]]:
    """Split rows into decoding batches by a cost model, deterministically.

    ``lengths[r][l]``: tokens row r holds in layer l. A batch costs ``fixed_cost`` (reading the
    weights, in token-layer units) plus, for every layer, the slots its kernel attends over: rows are
    right-padded to the longest, or (``split``: a :func:`~polykv_search.runtime.layouts.best_split`
    minimum saving; None: never) cut into two parts padded to their own longest
    (:func:`~polykv_search.runtime.layouts.row_parts`). Rows are taken from the shortest; a row joins the
    current batch when that is no dearer than a batch of its own, and while the batch has fewer than
    ``max_rows``.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be positive, got {max_rows!r}")

    def cost(rows: Sequence[int]) -> float:
        return fixed_cost + sum(layer_slots([lengths[r][l] for r in rows], split) for l in range(len(lengths[rows[0]])))

    groups: list[list[int]] = []
    current: list[int] = []
    for r in sorted(range(len(lengths)), key=lambda r: (sum(lengths[r]), r)):
        if current and len(current) < max_rows and cost([*current, r]) <= cost(current) + cost([r]):
            current.append(r)
            continue
        if current:
            groups.append(current)
        current = [r]
    if current:
        groups.append(current)
    return groups


class SharedScorer:
    """Runs samples for a fixed list of entries' plans under an applied runtime (any strategy: only
    its ``polykv`` attention and layer settings are used).

    Parameters
    ----------
    plans
        Per entry, the ``(prefill, decoding)`` plan of every layer (:func:`~polykv_search.runtime.strategy_plans`).
    batch_entries
        Rows per decoding batch at most (memory cap).
    split
        A decoding batch's rows may be cut in two parts, each padded to its own longest row (e.g. a
        FullKV row beside short ones), when that saves at least this many padded slots in a layer
        (:func:`~polykv_search.runtime.layouts.best_split`); None: one padded store per batch.
    head_groups
        Per entry, its layers split into head groups (:func:`~polykv_search.runtime.runtime.strategy_head_groups`;
        none by default). Such an entry shares the context call (each group of a row observes with its own
        query heads) and then decodes in the batch: in a split layer, the rows of one head split share a row
        batch per head set (:func:`~polykv_search.scoring.stacking.stacked_layer`), a row alone in its split is a
        part of its own (its groups keep their own stores; :func:`~polykv_search.runtime.layouts.row_parts`).
    fullkv_apart
        Trajectory jobs: FullKV generates alone first, then the entries are forced along its tokens (the
        reference path); False (default): FullKV decodes as a row of the entries' batch
        (:mod:`~polykv_search.scoring.trajectories`), and :meth:`run_many` batches samples too.
    """

    def __init__(
        self,
        model,
        runtime,
        plans: Sequence[Plans],
        *,
        batch_entries: int = 16,
        head_groups: Sequence[dict[int, list[HeadGroupPlan]]] | None = None,
        split: int | None = SPLIT_MIN_SAVING,
        fullkv_apart: bool = False,
    ):
        self.model = model
        self.fullkv_apart = fullkv_apart
        self.runtime = runtime
        self.plans = [list(p) for p in plans]
        self.head_groups = [dict(g) for g in head_groups] if head_groups is not None else [{} for _ in self.plans]
        if len(self.head_groups) != len(self.plans):
            raise ValueError(f"{len(self.head_groups)} head-group maps for {len(self.plans)} entries")
        self.batch_entries = batch_entries
        self.split = split
        self.caller = _Caller(model)
        self.num_layers = runtime.spec.num_layers
        self.full_rows = [
            not groups and all(not p.evicts and not d.evicts for p, d in plan)
            for plan, groups in zip(self.plans, self.head_groups)
        ]
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        dtype_bytes = next(model.parameters()).element_size()
        self.fixed_cost = param_bytes / runtime.spec.bytes_per_token(dtype_bytes)

    def _row(self, plan: Plans, groups: dict[int, list[HeadGroupPlan]] | None = None) -> list[RuntimeLayer]:
        # an entry with a model-level pattern (kvzip) keeps its prompt until the runtime's reconstruction
        # pass, which runs once per context call for every such entry (fanout_layer)
        groups = groups or {}
        defer = needs_pass(list(plan) + [(g.prefill, g.decoding) for layer in groups.values() for g in layer])
        detached = [{**self.runtime.layer_kwargs(l), "on_update": None} for l in range(len(plan))]
        return [
            cache_layer(l, p, d, groups.get(l), defer_prefill=defer, **detached[l]) for l, (p, d) in enumerate(plan)
        ]

    def _stacked(self, rows: Sequence[list[RuntimeLayer]]) -> PolyKVCache:
        """One decoding batch's cache: per layer, the rows' layers as one row batch, or as parts
        (:func:`~polykv_search.scoring.stacking.stacked_layer`: a long row's part, the rows of one head split)."""
        return PolyKVCache(
            [
                stacked_layer(l, [r[l] for r in rows], self.split, **self.runtime.layer_kwargs(l))
                for l in range(self.num_layers)
            ]
        )

    def _groups(self, rows: Sequence[list[RuntimeLayer]]) -> list[list[int]]:
        """Decoding batches: :func:`plan_groups` over every row (a row with head groups counts its longest
        group in each layer)."""
        return plan_groups(
            [[layer.length for layer in row] for row in rows], self.batch_entries, self.fixed_cost, self.split
        )

    @staticmethod
    def _write_back(cache: PolyKVCache) -> None:
        for layer in cache.layers:
            layer.write_back()

    @torch.inference_mode()
    def run(self, job: SampleJob, *, fidelity: bool = True) -> list[SampleOutcome]:
        """Every entry's outcome on ``job`` (same order as ``plans``)."""
        if job.trajectory:
            return self._run_trajectory(job) if self.fullkv_apart else run_trajectories(self, [job])[0]
        plans = list(self.plans)
        ref = next((i for i, full in enumerate(self.full_rows) if full), None)
        if job.teacher_forced and fidelity and ref is None:  # a hidden FullKV row for the reference
            plans.append([(FULL_PLAN, FULL_PLAN)] * self.num_layers)
            ref = len(plans) - 1
        rows = [self._row(plan, groups) for plan, groups in zip(plans, self.head_groups + [{}])]
        dev = self.caller.device
        t0 = time.perf_counter()
        first = self._context_call(job.context_ids, rows)
        _sync(dev)
        context_s = time.perf_counter() - t0
        groups = self._groups(rows)
        timings: list[dict[str, float]] = [{} for _ in rows]
        results: list = [None] * len(rows)
        for group in groups:
            if job.teacher_forced:
                out, timing = self._teacher_forced(job, [rows[i] for i in group], first)
            else:
                out, timing = self._generate(job, [rows[i] for i in group], first)
            for i, value in zip(group, out):
                results[i] = value
                timings[i] = {"context_s": context_s, **timing}
        outcomes = []
        reference = log_probs(results[ref]) if job.teacher_forced and fidelity and ref is not None else None
        for i in range(len(self.plans)):
            report = cache_report(rows[i])
            if job.teacher_forced:
                pred, new, logits = continuation_outcome(results[i], job.targets, reference), [], results[i]
            else:
                pred = new = results[i]
                logits = None
            outcomes.append(SampleOutcome(pred, timings[i], report.kv_bytes, report.full_kv_bytes, list(new), logits))
        return outcomes

    def run_many(self, jobs: Sequence[SampleJob], *, samples: int = 1) -> list[list[SampleOutcome]]:
        """Every entry's outcome on each of ``jobs`` (in order): trajectory jobs whose prompts have one length
        run ``samples`` at a time as one batch (unless ``fullkv_apart``), every other job alone."""
        out: list = [None] * len(jobs)
        batched = [i for i, job in enumerate(jobs) if job.trajectory and not self.fullkv_apart]
        for i in sorted(set(range(len(jobs))) - set(batched)):
            out[i] = self.run(jobs[i])
        for group in batch_groups([jobs[i] for i in batched], samples):
            for k, outcomes in zip(group, run_trajectories(self, [jobs[batched[k]] for k in group])):
                out[batched[k]] = outcomes
        return out

    def _context_call(self, context_ids: Sequence[int], rows) -> torch.Tensor:
        cache = PolyKVCache(
            [fanout_layer(l, [r[l] for r in rows], **self.runtime.layer_kwargs(l)) for l in range(self.num_layers)]
        )
        x = torch.tensor([list(context_ids)], dtype=torch.long, device=self.caller.device)
        out = self.model(
            input_ids=x, attention_mask=torch.ones_like(x), cache=cache, use_cache=True, **self.caller.last_only
        )
        return out.logits[0, -1:]  # [1, V]: the same first prediction for every entry

    def _call(self, ids: list[list[int]], cache, *, last_only: bool = True) -> torch.Tensor:
        x = torch.tensor(ids, dtype=torch.long, device=self.caller.device)
        return self.model(
            input_ids=x, cache=cache, use_cache=True, **(self.caller.last_only if last_only else {})
        ).logits

    def _teacher_forced(self, job: SampleJob, rows, first: torch.Tensor):
        t0 = time.perf_counter()
        target = list(job.targets)
        if len(target) > 1:
            cache = self._stacked(rows)
            if job.stepwise:  # one token per call: the decoding plans evict at every step
                rest = torch.cat([self._call([[t]] * len(rows), cache) for t in target[:-1]], dim=1)
            else:
                rest = self._call([target[:-1]] * len(rows), cache, last_only=False)
            self._write_back(cache)
            logits = [torch.cat([first, rest[i]], dim=0) for i in range(len(rows))]
        else:
            logits = [first] * len(rows)
        _sync(self.caller.device)
        return logits, {"question_s": 0.0, "decode_s": time.perf_counter() - t0}

    def _run_trajectory(self, job: SampleJob) -> list[SampleOutcome]:
        """FullKV generates the trajectory once (every FullKV entry's outcome); the other entries share one
        context call, then are teacher-forced along it one token per call, batched (and answer a question)."""
        trajectory = full_trajectory(
            self.caller, job.context_ids, job.generate_len, job.eos, job.question_ids, job.limit
        )
        full = cache_report(trajectory.cache.layers)
        evicting = [i for i, is_full in enumerate(self.full_rows) if not is_full]
        rows = [self._row(self.plans[i], self.head_groups[i]) for i in evicting]
        outcomes: list = [
            SampleOutcome(
                TrajectoryMeter.exact(trajectory),
                trajectory.timing,
                full.kv_bytes,
                full.full_kv_bytes,
                list(trajectory.answer_ids),
            )
            if is_full
            else None
            for is_full in self.full_rows
        ]
        if not rows:
            return outcomes
        dev = self.caller.device
        t0 = time.perf_counter()
        first = self._context_call(job.context_ids, rows)
        _sync(dev)
        context_s = time.perf_counter() - t0
        for group in self._groups(rows):
            t1 = time.perf_counter()
            members = [rows[i] for i in group]
            meter = TrajectoryMeter(trajectory, len(group), job.eos)
            cache = self._stacked(members)
            step = lambda ids, cache=cache: self._call([ids] * len(members), cache)[:, -1]  # noqa: E731
            last = force(step, first.expand(len(group), -1), meter, feed_last=job.limit > 0)
            if job.limit > 0:
                new, timing = self._decode(job, members, cache, last)
            else:
                self._write_back(cache)
                new, timing = [[] for _ in group], {"question_s": 0.0}
            _sync(dev)
            timing = {"context_s": context_s, "question_s": timing["question_s"], "decode_s": time.perf_counter() - t1}
            for j, i in enumerate(group):
                report = cache_report(rows[i])
                outcomes[evicting[i]] = SampleOutcome(
                    meter.outcome(j), timing, report.kv_bytes, report.full_kv_bytes, list(new[j])
                )
        return outcomes

    def _generate(self, job: SampleJob, rows, first: torch.Tensor):
        """Question call, then greedy decoding of every row; a row stops at EOS or at ``job.limit``."""
        t0 = time.perf_counter()
        new, timing = self._decode(job, rows, self._stacked(rows), first.expand(len(rows), -1))
        return new, {"question_s": timing["question_s"], "decode_s": time.perf_counter() - t0 - timing["question_s"]}

    def _decode(self, job: SampleJob, rows, cache, logits: torch.Tensor):
        """Question call (when there is one; else ``logits`` ``[rows, V]`` predict the first token), then
        greedy decoding of every row on its stacked ``cache``; a row stops at EOS or at ``job.limit``."""
        t0 = time.perf_counter()
        active = list(range(len(rows)))
        new: list[list[int]] = [[] for _ in rows]
        if job.question_ids:
            logits = self._call([list(job.question_ids)] * len(rows), cache)[:, -1]
        _sync(self.caller.device)
        t1 = time.perf_counter()
        for step in range(job.limit):
            tokens = logits.argmax(dim=-1).tolist()
            going = []
            for j, i in enumerate(active):
                if tokens[j] in job.eos:
                    continue
                new[i].append(tokens[j])
                if step + 1 < job.limit:
                    going.append((i, tokens[j]))
            if not going:
                break
            if len(going) < len(active):  # finished rows leave the batch
                active = [i for i, _ in going]
                self._write_back(cache)
                cache = self._stacked([rows[i] for i in active])
            logits = self._call([[t] for _, t in going], cache)[:, -1]
        self._write_back(cache)
        _sync(self.caller.device)
        return new, {"question_s": t1 - t0, "decode_s": time.perf_counter() - t1}
