"""The evaluation sample and how it becomes token ids.

Every task produces :class:`Sample` objects. A sample has a *context* (prefilled in one call: this
is the part the eviction runtime compresses), a *question* (prefilled in a second call on top of
the compressed cache, so it is never compressed at prefill) and, for instruct models, an *answer
prefix* forced after the assistant header, as RULER does. Teacher-forced tasks (continuation) carry
token ids instead of text.

:func:`encode_prompt` is the one place that turns a sample into ``(context_ids, question_ids)``;
generators use it to measure lengths and the runner uses it to run, so both always agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Sample:
    """One evaluation item.

    Attributes
    ----------
    id
        Stable identifier (task name, seed and index, or the dataset's ``_id``).
    task
        Registry name of the task that produced it.
    context
        Text prefilled (and compressed) in the first call.
    question
        Text prefilled in the second call, after the compressed context.
    answers
        Reference answers (meaning depends on the task's metric).
    answer_prefix
        Forced at the start of the model's answer (after the assistant header when a chat
        template is used, else appended to the question).
    chat
        Whether to wrap context + question in the tokenizer's chat template when it has one.
    context_ids, target_ids
        Pre-tokenized context and teacher-forced continuation (teacher-forced tasks only).
    max_new_tokens
        Default generation length for this sample (the runner's argument overrides it).
    meta
        Task-specific details (needle positions, keys, classes, ...), JSON-serializable.
    """

    id: str
    task: str
    context: str = ""
    question: str = ""
    answers: list[str] = field(default_factory=list)
    answer_prefix: str = ""
    chat: bool = True
    context_ids: list[int] | None = None
    target_ids: list[int] | None = None
    max_new_tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return cls(**data)


def samples_fingerprint(samples: Sequence[Sample]) -> str:
    """A short hash of the samples' content (recorded in results to prove runs saw the same data)."""
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps(s.to_dict(), sort_keys=True).encode("utf-8"))
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------ tokenization
def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _encode(tokenizer, text: str, *, special: bool) -> list[int]:
    if not text:
        return []
    # verbose=False: measuring a too-long candidate prompt is expected, not worth a warning.
    return list(tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"])


def render_prompt(tokenizer, sample: Sample, chat: bool | None = None) -> tuple[str, str, bool]:
    """The prompt as text, split into ``(context_text, question_text, templated)``.

    ``chat=None`` uses the tokenizer's chat template when it has one and the sample allows it.
    With a template, context + question form the user turn, the generation prompt (assistant
    header) follows, and the answer prefix is appended after it; the split falls right after the
    context inside the rendered text. ``templated`` says whether the template was used (its text
    then already holds any BOS token). Reasoning modes (Qwen3's thinking) are switched off.
    """
    use_chat = sample.chat and has_chat_template(tokenizer) if chat is None else bool(chat)
    if use_chat and not has_chat_template(tokenizer):
        raise ValueError("chat=True but the tokenizer has no chat template")
    if not use_chat:
        question = sample.question + sample.answer_prefix
        return sample.context, question, False
    user = sample.context + sample.question
    # enable_thinking=False: templates with a reasoning mode (Qwen3) answer directly; others ignore it.
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    start = rendered.find(user)
    if start < 0:  # the template rewrote the text (e.g. stripped it); fall back to the context alone
        start = rendered.find(sample.context.strip())
        if start < 0:
            raise ValueError("the chat template does not keep the context verbatim")
        split = start + len(sample.context.strip())
    else:
        split = start + len(sample.context)
    prefix = sample.answer_prefix.strip()
    question = rendered[split:] + prefix
    return rendered[:split], question, True


def encode_prompt(tokenizer, sample: Sample, chat: bool | None = None) -> tuple[list[int], list[int]]:
    """``(context_ids, question_ids)`` exactly as the runner feeds them to the model."""
    if sample.context_ids is not None:
        return list(sample.context_ids), _encode(tokenizer, sample.question, special=False)
    context, question, templated = render_prompt(tokenizer, sample, chat)
    context_ids = _encode(tokenizer, context, special=not templated)
    if not context_ids:  # a context of zero tokens would leave nothing to prefill
        raise ValueError(f"sample {sample.id!r} has an empty context")
    return context_ids, _encode(tokenizer, question, special=False)


def prompt_length(tokenizer, sample: Sample, chat: bool | None = None) -> int:
    """Total prompt tokens (context + question + template) of ``sample``."""
    c, q = encode_prompt(tokenizer, sample, chat)
    return len(c) + len(q)


def fit_to_length(
    build: Callable[[int], Sample],
    measure: Callable[[Sample], int],
    target: int,
    lo: int,
    hi: int,
) -> tuple[Sample, int]:
    """The largest size ``n`` in ``[lo, hi]`` whose ``build(n)`` measures at most ``target``.

    ``measure(build(n))`` must be non-decreasing in ``n`` (more haystack, more tokens), as RULER's
    binary search over haystack size assumes. Raises ``ValueError`` when even ``build(lo)`` is too
    long (the target cannot hold the task's fixed text).
    """
    first = build(lo)
    if measure(first) > target:
        raise ValueError(
            f"context length {target} is too short for this task (its smallest prompt has {measure(first)} tokens)"
        )
    best, best_n = first, lo
    a, b = lo + 1, hi
    while a <= b:
        mid = (a + b) // 2
        s = build(mid)
        if measure(s) <= target:
            best, best_n = s, mid
            a = mid + 1
        else:
            b = mid - 1
    return best, best_n


def grow_to_fit(
    build: Callable[[int], Sample], measure: Callable[[Sample], int], target: int, lo: int, guess: int
) -> tuple[Sample, int]:
    """The largest size whose prompt fits ``target``: a linear estimate, bracketed, then bisected."""
    base = measure(build(lo))
    if base > target:
        raise ValueError(f"context length {target} is too short for this task (its smallest prompt has {base} tokens)")
    probe = max(lo + 1, min(guess, lo + 256))
    per_unit = (measure(build(probe)) - base) / (probe - lo)
    if per_unit <= 0:
        raise ValueError("the prompt does not grow with the haystack")
    estimate = lo + int((target - base) / per_unit)
    a, b = max(lo, int(estimate * 0.98)), max(lo + 1, int(estimate * 1.02) + 2)
    while measure(build(b)) <= target:  # estimate too low: move the bracket up
        a, b = b, 2 * b
        if b > 50_000_000:
            raise ValueError("the prompt does not grow with the haystack")
    while a > lo and measure(build(a)) > target:  # estimate too high: move it down
        a, b = max(lo, a // 2), a
    return fit_to_length(build, measure, target, a, b)
