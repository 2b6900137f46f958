"""The decode suite: short prompts followed by long generation, where decoding-phase eviction decides.

Every sample is run as a *trajectory* job (``kind = "trajectory"``): FullKV greedy-decodes
``generate_len`` tokens (N, default 512) from the prompt, with end-of-sequence tokens banned so every
trajectory has N tokens; every entry is then teacher-forced along that same trajectory one token per
call, its decoding plan evicting step by step exactly as in generation
(:mod:`~polykv_search.evaluation.trajectory`). The cache grows to prompt + N, far past every decoding
budget.

``decode/trajectory``
    A held-out document window of ``context_len`` tokens is the prompt (plain text, no chat template).
    Per generated position t: KL(FullKV ‖ entry) of the next-token distributions, top-1 agreement
    (the entry's greedy choice equals FullKV's token) and ΔNLL of FullKV's token, also per position
    bucket (0-128, 128-256, ...). The score is the top-1 agreement in percent.
``decode/recall``
    The prompt states a few facts (``The secret number of Mary is 40712.``) and asks the model to
    continue a held-out passage; FullKV writes N tokens, every entry is teacher-forced along them,
    then a question about one fact follows (a new user turn with a chat template) and the entry
    answers greedily. Exact match of the number; the trajectory's fidelity is recorded beside it.
``decode/recall_carry``
    As ``decode/recall``, but the question is stated in the prompt, before the passage; after the
    generation a cue that names no one asks for the answer, so the model has to carry the question.
    Registered, not in the suite's default run. ``decode/recall_spread``: see
    :mod:`~polykv_search.evaluation.decode_spread`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from polykv_search.evaluation.base import SampleCheckError, Task, as_texts, check_request, sample_rng
from polykv_search.evaluation.broad import Continuation, bos_ids
from polykv_search.evaluation.samples import Sample, has_chat_template

GENERATE_LEN = 512
NAMES = (
    "Mary",
    "John",
    "Alice",
    "Henry",
    "Clara",
    "Thomas",
    "Emma",
    "George",
    "Lucy",
    "Edward",
    "Anne",
    "William",
    "Harriet",
    "Robert",
    "Jane",
    "Charles",
)
_MARK = "\x00TRAJECTORY\x00"


class DecodeTask(Task):
    """A task of the decode suite: a prompt, N FullKV-generated tokens teacher-forced, maybe a question."""

    suite = "decode"
    kind = "trajectory"
    generate_len: ClassVar[int] = GENERATE_LEN

    def __init__(self, generate_len: int | None = None):
        if generate_len is not None:
            if not isinstance(generate_len, int) or generate_len < 2:
                raise ValueError(f"generate_len must be an integer >= 2, got {generate_len!r}")
            self.generate_len = generate_len

    def info(self) -> dict:
        return {**super().info(), "generate_len": self.generate_len}

    def check(self, sample: Sample) -> None:
        if not sample.context_ids or sample.meta.get("generate_len") != self.generate_len:
            raise SampleCheckError(f"{sample.id}: malformed decode sample")

    def extra_metrics(self, predictions, samples) -> dict[str, float]:
        """Fidelity means over samples (every sample has N positions): kl, dnll, top-1 agreement %."""
        extra: dict[str, float] = {}
        for key in ("kl", "dnll", "agree"):
            values = [float(p[key]) for p in predictions if isinstance(p, dict) and key in p]
            if values and len(values) == len(predictions):
                extra[key] = sum(values) / len(values)
        return extra


class TrajectoryFidelity(DecodeTask):
    name = "decode/trajectory"
    description = "teacher-forced along FullKV's own N-token greedy generation: KL, top-1 agreement, ΔNLL per bucket"
    metric = "top-1 agreement % with FullKV (KL per position bucket beside it)"
    max_new_tokens = 0
    version = "1"

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        check_request(n_samples, context_len)
        docs = [t for t in as_texts(haystack_texts) if t.strip()]
        if not docs:
            raise ValueError("decode/trajectory needs held-out document text")
        prefix = bos_ids(tokenizer)
        body = context_len - len(prefix)
        if body < 1:
            raise ValueError(f"context length {context_len} is too short")
        samples = []
        for index in range(n_samples):
            window, where = _prose_window(tokenizer, docs, body, sample_rng(seed, self.name, index))
            sample = Sample(
                id=f"{self.name}:{seed}:{index}",
                task=self.name,
                chat=False,
                context_ids=prefix + window,
                max_new_tokens=0,
                meta={**where, "context_len": context_len, "generate_len": self.generate_len},
            )
            self.check(sample)
            samples.append(sample)
        return samples

    def score(self, predictions: Sequence[dict], samples: Sequence[Sample]) -> float:
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        total = sum(int(p["total"]) for p in predictions)
        return 100.0 * sum(int(p["agree_tokens"]) for p in predictions) / total if total else 0.0


class Recall(DecodeTask):
    name = "decode/recall"
    description = "facts in the prompt, N tokens of FullKV's own continuation teacher-forced, then a question"
    metric = "exact match % of the number asked for"
    max_new_tokens = 8
    facts: ClassVar[int] = 4
    version = "1"

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        check_request(n_samples, context_len)
        docs = [t for t in as_texts(haystack_texts) if t.strip()]
        if not docs:
            raise ValueError("decode/recall needs held-out document text")
        chat = has_chat_template(tokenizer)
        samples = []
        for index in range(n_samples):
            rng = sample_rng(seed, self.name, index)
            names = rng.sample(NAMES, self.facts)
            numbers = [str(rng.randint(10000, 99999)) for _ in names]
            asked = rng.randrange(self.facts)
            facts = "".join(f"The secret number of {n} is {v}.\n" for n, v in zip(names, numbers))
            head, question, prefix = self.texts(facts, names[asked])
            fixed = len(_prompt_ids(tokenizer, head, "", chat))
            if context_len - fixed < 8:
                raise ValueError(f"context length {context_len} is too short for {self.name} ({fixed} fixed tokens)")
            window, where = _prose_window(tokenizer, docs, context_len - fixed, rng)
            passage = tokenizer.decode(window, skip_special_tokens=True)
            sample = Sample(
                id=f"{self.name}:{seed}:{index}",
                task=self.name,
                chat=chat,
                context_ids=_prompt_ids(tokenizer, head, passage, chat),
                question=_question_text(tokenizer, head + passage, question, prefix, chat),
                answers=[numbers[asked]],
                answer_prefix=prefix,
                max_new_tokens=self.max_new_tokens,
                meta={
                    **where,
                    "context_len": context_len,
                    "generate_len": self.generate_len,
                    "facts": facts.splitlines(),
                    "asked": names[asked],
                    **self.extra_meta(names[asked]),
                },
            )
            self.check(sample)
            samples.append(sample)
        return samples

    def texts(self, facts: str, name: str) -> tuple[str, str, str]:
        """The prompt's text before the passage, the question asked after the generation, its answer prefix."""
        head = f"Remember these facts.\n{facts}\nNow continue this passage from a novel:\n\n"
        return head, f"What is the secret number of {name}?", f"The secret number of {name} is"

    def extra_meta(self, name: str) -> dict:
        """Details a variant adds to a sample's ``meta``."""
        return {}

    def check(self, sample: Sample) -> None:
        super().check(sample)
        fact = f"The secret number of {sample.meta.get('asked')} is {(sample.answers or [''])[0]}."
        if fact not in sample.meta.get("facts", []):
            raise SampleCheckError(f"{sample.id}: the fact asked about is not in the prompt")

    @staticmethod
    def number(prediction: str) -> str:
        found = re.search(r"\d+", prediction)
        return found.group(0) if found else ""

    def score(self, predictions: Sequence[dict], samples: Sequence[Sample]) -> float:
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        if not samples:
            return 0.0
        hits = sum(self.number(p["answer"]) == s.answers[0] for p, s in zip(predictions, samples))
        return 100.0 * hits / len(samples)


class CarriedRecall(Recall):
    name = "decode/recall_carry"
    description = "facts and a question before the passage; after N tokens of FullKV's continuation, 'answer it now'"
    metric = "exact match % of the number asked for (the question is not repeated after the generation)"
    version = "1"

    def texts(self, facts: str, name: str) -> tuple[str, str, str]:
        """The question is stated before the passage; after the generation only a cue to answer it follows,
        which names no one, so the model has to carry the question through the generated tokens."""
        head = (
            f"Remember these facts.\n{facts}\n{self.carried_question(name)} Do not answer it yet: first continue "
            "this passage from a novel. I will ask for your answer after it.\n\n"
        )
        return head, "Now answer the question I asked before the passage.", "The secret number is"

    @staticmethod
    def carried_question(name: str) -> str:
        return f"My question: what is the secret number of {name}?"

    def extra_meta(self, name: str) -> dict:
        return {"carried_question": self.carried_question(name)}


def _prompt_ids(tokenizer, head: str, passage: str, chat: bool) -> list[int]:
    """The first user turn (and the assistant header) with a chat template, else BOS + text."""
    if not chat:
        return list(tokenizer(head + passage, add_special_tokens=True, verbose=False)["input_ids"])
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": head + passage}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    return list(tokenizer(rendered, add_special_tokens=False, verbose=False)["input_ids"])


def _question_text(tokenizer, user: str, question: str, prefix: str, chat: bool) -> str:
    """What follows the generated stretch: a new user turn and the assistant header (chat), or a plain
    ``Question:``/``Answer:`` pair; the answer prefix ends it."""
    if chat:
        rendered = tokenizer.apply_chat_template(
            [
                {"role": "user", "content": user},
                {"role": "assistant", "content": _MARK},
                {"role": "user", "content": question},
            ],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        at = rendered.find(_MARK)
        if at >= 0:
            return rendered[at + len(_MARK) :] + prefix
    return f"\n\nQuestion: {question}\nAnswer: {prefix}"


def _prose_window(tokenizer, docs: list[str], need: int, rng) -> tuple[list[int], dict]:
    """``need`` tokens of a held-out document (seeded), as ``broad/continuation`` cuts its windows."""
    order = list(range(len(docs)))
    rng.shuffle(order)
    for doc in order:
        found = Continuation._window(tokenizer, docs[doc], need, rng)
        if found is not None:
            return found[0], {"document": doc, **found[1]}
    stream = list(tokenizer("\n\n".join(docs), add_special_tokens=False, verbose=False)["input_ids"])
    if len(stream) < need:
        raise ValueError(f"the held-out text has {len(stream)} tokens; {need} are needed for one sample")
    offset = rng.randint(0, len(stream) - need)
    return stream[offset : offset + need], {"document": "all documents", "token_offset": offset}


DECODE_TASKS: tuple[type[Task], ...] = (TrajectoryFidelity, Recall)
