"""What one sample costs to score, in decoding-step equivalents: the weights of the time left.

A score run's samples differ in cost by more than an order of magnitude: a teacher-forced broad
sample is one context pass and one pass over its continuation, while a RULER sample decodes up to
its task's generation limit (120 tokens for cwe), one batched step per token. Progress counted in
samples therefore runs far ahead when the cheap samples come first. :func:`sample_cost` weighs a
sample by the decoding steps it may take plus its prompt, converted to decoding-step equivalents
with :data:`PROMPT_TOKENS_PER_STEP`.
"""

from __future__ import annotations

from typing import Any

from polykv_search.evaluation.runner import generation_limit

#: prompt tokens (context, question, teacher-forced continuation) whose passes cost about as much as
#: one batched decoding step of a score run; measured on the quickstart (docs/quickstart.md)
PROMPT_TOKENS_PER_STEP = 64.0


def sample_cost(task: Any, sample: Any, *, context_len: int, max_new_tokens: int | None = None) -> float:
    """Decoding-step equivalents of scoring ``sample`` of ``task`` (every entry together).

    The decoding steps are the generation limit (the override, else the sample's, else the task's;
    none for teacher-forced tasks, whose continuation is one pass); the prompt is ``context_len``
    tokens plus a teacher-forced continuation, at :data:`PROMPT_TOKENS_PER_STEP` tokens a step.
    """
    forced = task.kind == "teacher_forced"
    steps = 0 if forced else generation_limit(task, sample, max_new_tokens)
    prompt = context_len + (len(sample.target_ids or ()) if forced else 0)
    return steps + prompt / PROMPT_TOKENS_PER_STEP


def run_costs(
    task_samples: dict[str, tuple[Any, list]], *, context_len: int, max_new_tokens: int | None = None
) -> dict[tuple[str, int], float]:
    """:func:`sample_cost` of every (task name, sample index) of a run."""
    return {
        (task.name, i): sample_cost(task, sample, context_len=context_len, max_new_tokens=max_new_tokens)
        for task, samples in task_samples.values()
        for i, sample in enumerate(samples)
    }
