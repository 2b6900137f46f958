"""What one sample costs to score, in decoding-step equivalents: the weights of the time left.

A score run's samples differ in cost by more than an order of magnitude: a teacher-forced broad
sample is one context pass and one pass over its continuation, while a RULER sample decodes up to
its task's generation limit (120 tokens for cwe), one batched step per token. Progress counted in
samples therefore runs far ahead when the cheap samples come first. :func:`sample_cost` weighs a
sample by the decoding steps it may take plus its prompt and teacher-forced continuation, converted
to decoding-step equivalents with :data:`PROMPT_TOKENS_PER_STEP` and :data:`FORCED_TOKEN_STEPS`.

The constants are a least-squares fit to the per-task median sample times of a quickstart score run
(12 entries, 512-token contexts, SmolLM2 on 2 CPU cores; docs/quickstart.md): a sample's prompt took
1.45 s, a batched decoding step 0.179 s and a teacher-forced continuation token 0.024 s. Only their
ratios matter: the rate itself is measured while the run goes.
"""

from __future__ import annotations

from typing import Any

from polykv_search.evaluation.runner import generation_limit

#: prompt tokens whose prefill costs about as much as one batched decoding step of a score run
PROMPT_TOKENS_PER_STEP = 64.0
#: decoding steps one teacher-forced continuation token costs (every row's pass and the fidelity pass)
FORCED_TOKEN_STEPS = 0.13


def sample_cost(task: Any, sample: Any, *, context_len: int, max_new_tokens: int | None = None) -> float:
    """Decoding-step equivalents of scoring ``sample`` of ``task`` (every entry together).

    The decoding steps are the generation limit (the override, else the sample's, else the task's),
    an upper bound: rows that emit EOS stop early. A teacher-forced task decodes nothing; its
    continuation costs :data:`FORCED_TOKEN_STEPS` a token. The ``context_len``-token prompt costs one
    step per :data:`PROMPT_TOKENS_PER_STEP` tokens.
    """
    prompt = context_len / PROMPT_TOKENS_PER_STEP
    if task.kind == "teacher_forced":
        return prompt + FORCED_TOKEN_STEPS * len(sample.target_ids or ())
    return prompt + generation_limit(task, sample, max_new_tokens)


def run_costs(
    task_samples: dict[str, tuple[Any, list]], *, context_len: int, max_new_tokens: int | None = None
) -> dict[tuple[str, int], float]:
    """:func:`sample_cost` of every (task name, sample index) of a run."""
    return {
        (task.name, i): sample_cost(task, sample, context_len=context_len, max_new_tokens=max_new_tokens)
        for task, samples in task_samples.values()
        for i, sample in enumerate(samples)
    }
