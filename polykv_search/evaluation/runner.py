"""Run a task's samples through a model with plain HF calls, optionally inside the eviction runtime.

For every sample, with a fresh cache and inside ``runner()`` when one is given:

1. the context is prefilled in one call (``use_cache=True``; under the runtime this is the call
   whose cache gets compressed);
2. the question (with chat-template tail and answer prefix) is prefilled in a second call on that
   cache, so it is never compressed at prefill;
3. greedy decoding, one token per call, until ``max_new_tokens`` or an EOS token.

Teacher-forced tasks replace 2-3 with one call that feeds the continuation (all but its last
token) on the compressed cache; the first continuation token is predicted by the context call.
Trajectory tasks (the decode suite) first let FullKV generate, then feed its tokens one per call
(:mod:`~polykv_search.evaluation.trajectory`).

Batch size is 1, so no call needs padding; only the first call passes an attention mask.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from polykv_search.evaluation.base import Task
from polykv_search.evaluation.fidelity import continuation_outcome
from polykv_search.evaluation.samples import Sample, encode_prompt, samples_fingerprint
from polykv_search.evaluation.trajectory import forced_run, full_trajectory


@dataclass
class TaskResult:
    """Scores and per-sample records of one task run."""

    task: str
    suite: str
    score: float
    n_samples: int
    predictions: list[Any]
    per_sample: list[dict[str, Any]]
    extra: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def eos_token_ids(model, tokenizer) -> set[int]:
    """EOS ids of the tokenizer and the model's generation config (end-of-turn tokens included)."""
    ids: set[int] = set()
    for value in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else list(value))
    return ids


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover
        return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Caller:
    """Plain HF forward calls, with ``logits_to_keep=1`` where the model accepts it."""

    def __init__(self, model):
        self.model = model
        self.device = _device(model)
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover
            params = {}
        self.last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def prefill(self, ids: Sequence[int], *, last_only: bool = True):
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        return self.model(
            input_ids=x, attention_mask=torch.ones_like(x), use_cache=True, **(self.last_only if last_only else {})
        )

    def extend(self, ids: Sequence[int], cache, *, last_only: bool = True):
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        return self.model(input_ids=x, cache=cache, use_cache=True, **(self.last_only if last_only else {}))


@torch.inference_mode()
def greedy_generate(
    model,
    context_ids: Sequence[int],
    question_ids: Sequence[int],
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int] = frozenset(),
    caller: _Caller | None = None,
) -> tuple[list[int], dict[str, float]]:
    """Context call, question call, then greedy decoding; returns new ids and timings (s)."""
    caller = caller or _Caller(model)
    dev = caller.device
    t0 = time.perf_counter()
    out = caller.prefill(context_ids)
    cache, logits = out.cache, out.logits[:, -1]
    _sync(dev)
    t1 = time.perf_counter()
    if question_ids:
        out = caller.extend(question_ids, cache)
        cache, logits = out.cache, out.logits[:, -1]
    _sync(dev)
    t2 = time.perf_counter()
    new: list[int] = []
    for step in range(max_new_tokens):
        token = int(logits.argmax(dim=-1)[0])
        if token in eos_ids:
            break
        new.append(token)
        if step + 1 == max_new_tokens:
            break
        out = caller.extend([token], cache)
        cache, logits = out.cache, out.logits[:, -1]
    _sync(dev)
    t3 = time.perf_counter()
    return new, {"context_s": t1 - t0, "question_s": t2 - t1, "decode_s": t3 - t2}


@torch.inference_mode()
def teacher_forced_logits(
    model,
    context_ids: Sequence[int],
    target_ids: Sequence[int],
    caller: _Caller | None = None,
    *,
    stepwise: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Context call, then the continuation (all but its last token) in one call, or one token per call
    (``stepwise``: decoding plans evict at every step): logits ``[m, V]``."""
    caller = caller or _Caller(model)
    dev = caller.device
    t0 = time.perf_counter()
    out = caller.prefill(context_ids)
    first = out.logits[0, -1:]
    _sync(dev)
    t1 = time.perf_counter()
    if len(target_ids) > 1:
        if stepwise:
            rest = torch.cat([caller.extend([t], out.cache).logits[0, -1:] for t in target_ids[:-1]])
        else:
            rest = caller.extend(target_ids[:-1], out.cache, last_only=False).logits[0]
        logits = torch.cat([first, rest], dim=0)
    else:
        logits = first
    _sync(dev)
    t2 = time.perf_counter()
    return logits, {"context_s": t1 - t0, "question_s": 0.0, "decode_s": t2 - t1}


def teacher_forced(
    model,
    context_ids: Sequence[int],
    target_ids: Sequence[int],
    caller: _Caller | None = None,
    reference: torch.Tensor | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """Context call, then the continuation in one call; next-token hits and summed NLL (and, given the
    FullKV ``reference`` log-probs, the fidelity ``kl`` / ``dnll``: see :mod:`~polykv_search.evaluation.fidelity`)."""
    logits, timing = teacher_forced_logits(model, context_ids, target_ids, caller)
    return continuation_outcome(logits, target_ids, reference), timing


def run_task(
    model,
    tokenizer,
    task: Task,
    samples: Sequence[Sample],
    runner: Callable[[], AbstractContextManager] | None = None,
    max_new_tokens: int | None = None,
    *,
    chat: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_sample: Callable[[Any, Sample, dict[str, Any]], None] | None = None,
) -> TaskResult:
    """Run ``samples`` of ``task`` and score them.

    Parameters
    ----------
    runner
        Factory of a context manager entered around each sample (e.g.
        ``lambda: apply_strategy(model, strategy)``); ``None`` runs the model as is (FullKV).
    max_new_tokens
        Overrides the samples' and the task's generation length.
    chat
        ``None`` uses the chat template when the tokenizer has one and the sample allows it.
    progress
        Called as ``progress(done, total)`` after each sample.
    on_sample
        Called inside the runner's context after each sample as ``on_sample(entered, sample,
        record)``, where ``entered`` is what the context manager returned; it may add fields to
        the per-sample ``record`` (e.g. KV bytes held).
    """
    caller = _Caller(model)
    eos = eos_token_ids(model, tokenizer)
    acc = TaskAccumulator(task)
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        for i, sample in enumerate(samples):
            context_ids, question_ids = encode_prompt(tokenizer, sample, chat)
            trajectory = None
            if task.kind == "trajectory":  # FullKV's own generation first, outside the runner
                limit = generation_limit(task, sample, max_new_tokens) if question_ids else 0
                banned = frozenset(eos)
                n = int(sample.meta["generate_len"])
                trajectory = full_trajectory(caller, context_ids, n, banned, question_ids, limit)
            with runner() if runner is not None else nullcontext() as entered:
                if trajectory is not None:
                    out, ids, timing = forced_run(caller, trajectory, context_ids, banned, question_ids, limit)
                    pred = {**out, "answer": tokenizer.decode(ids, skip_special_tokens=True)} if limit > 0 else out
                    n_new = len(ids)
                elif task.kind == "teacher_forced":
                    pred, timing = teacher_forced(model, context_ids, continuation_ids(sample), caller)
                    n_new = 0
                else:
                    limit = generation_limit(task, sample, max_new_tokens)
                    ids, timing = greedy_generate(model, context_ids, question_ids, limit, eos, caller)
                    pred = tokenizer.decode(ids, skip_special_tokens=True)
                    n_new = len(ids)
                record = sample_record(task, sample, pred, context_ids, question_ids, n_new, timing)
                if on_sample is not None:
                    on_sample(entered, sample, record)
            acc.add(pred, record)
            if progress is not None:
                progress(i + 1, len(samples))
    finally:
        model.train(was_training)
    return acc.result(samples, time.perf_counter() - start)


def continuation_ids(sample: Sample) -> list[int]:
    if not sample.target_ids:
        raise ValueError(f"sample {sample.id!r} has no continuation to score")
    return list(sample.target_ids)


def generation_limit(task: Task, sample: Sample, max_new_tokens: int | None) -> int:
    """New tokens to generate: the override, else the sample's, else the task's."""
    limit = max_new_tokens if max_new_tokens is not None else sample.max_new_tokens
    return task.max_new_tokens if limit is None else limit


#: fidelity fields of a prediction dict lifted to the top of its per-sample record (``*_buckets``: the
#: trajectory's per-position-bucket means, see :mod:`~polykv_search.evaluation.trajectory`)
FIDELITY_KEYS = ("kl", "dnll", "agree", "kl_buckets", "agree_buckets", "dnll_buckets")


def sample_record(
    task: Task, sample: Sample, pred: Any, context_ids, question_ids, n_new: int, timing: dict
) -> dict[str, Any]:
    """The per-sample record of a results file (fidelity ``kl``/``dnll`` lifted to the top level)."""
    record = {
        "id": sample.id,
        "prediction": pred,
        "answers": list(sample.answers),
        "score": task.score([pred], [sample]),
        "context_tokens": len(context_ids),
        "question_tokens": len(question_ids),
        "new_tokens": n_new,
        **timing,
    }
    if isinstance(pred, dict):
        record.update({k: pred[k] for k in FIDELITY_KEYS if k in pred})
    return record


class TaskAccumulator:
    """Collects one task's predictions and per-sample records, then builds its :class:`TaskResult`."""

    def __init__(self, task: Task):
        self.task = task
        self.predictions: list[Any] = []
        self.records: list[dict[str, Any]] = []
        self.totals = {"context_s": 0.0, "question_s": 0.0, "decode_s": 0.0}
        self.new_tokens = 0
        self.prompt_tokens = 0

    def add(self, pred: Any, record: dict[str, Any]) -> None:
        self.predictions.append(pred)
        self.records.append(record)
        for key in self.totals:
            self.totals[key] += record[key]
        self.new_tokens += record["new_tokens"]
        self.prompt_tokens += record["context_tokens"] + record["question_tokens"]

    def result(self, samples: Sequence[Sample], wall: float) -> TaskResult:
        task, totals, samples = self.task, self.totals, list(samples)
        prefill_s = totals["context_s"] + totals["question_s"]
        timing = {
            "total_s": wall,
            **totals,
            "prefill_tokens_per_s": self.prompt_tokens / prefill_s if prefill_s > 0 else None,
            "decode_tokens_per_s": self.new_tokens / totals["decode_s"]
            if totals["decode_s"] > 0 and self.new_tokens
            else None,
        }
        return TaskResult(
            task=task.name,
            suite=task.suite,
            score=float(task.score(self.predictions, samples)) if samples else 0.0,
            n_samples=len(samples),
            predictions=self.predictions,
            per_sample=self.records,
            extra=task.extra_metrics(self.predictions, samples) if samples else {},
            timing=timing,
            meta={
                **task.info(),
                "samples_fingerprint": samples_fingerprint(samples),
                "prompt_tokens": self.prompt_tokens,
            },
        )


def suite_scores(results: Sequence[TaskResult]) -> dict[str, float]:
    """Unweighted mean of task scores per suite."""
    by_suite: dict[str, list[float]] = {}
    for r in results:
        by_suite.setdefault(r.suite, []).append(r.score)
    return {suite: sum(v) / len(v) for suite, v in by_suite.items()}
