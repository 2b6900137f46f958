"""``decode/recall_spread``: facts spread through a long passage, several questions after the generation.

The prompt is one held-out passage of ``context_len`` tokens in all (1,024 is the intended length) with
``facts`` statements (``The secret number of Mary is 40712.``, the decode suite's own format) inserted
at sentence starts, one in each of ``facts`` equal stretches of the passage, so the evidence lies
everywhere from its start to its end rather than in one block. FullKV continues the passage for N
tokens; every entry is teacher-forced along them; then one question turn asks for ``questions`` of the
numbers at once, the answer prefix forcing the first name (``Mary:``) and so the ``name: number``
format. Each question is scored by exact match of its number (:meth:`SpreadRecall.hits`); a sample
scores the mean over its questions. The questions share one answer because the engines feed one
question call per sample (:class:`~polykv_search.scoring.job.SampleJob`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from polykv_search.evaluation.base import SampleCheckError, as_texts, check_request, sample_rng
from polykv_search.evaluation.decode import NAMES, DecodeTask, Recall, _prompt_ids, _prose_window, _question_text
from polykv_search.evaluation.samples import Sample, has_chat_template

HEAD = (
    "Secret numbers are hidden in the passage below, taken from a novel. Remember every one of them; "
    "then continue the passage.\n\n"
)
#: where a sentence starts: after its predecessor's end mark (and a closing quote) and whitespace
_SENTENCE_START = re.compile(r"(?<=[.!?])[\"')]?\s+")
_WORD_START = re.compile(r"\s+")
_TITLE = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|Col|Capt|Rev)\.[\"')]?\s+$")


def statement(name: str, number: str) -> str:
    return f"The secret number of {name} is {number}."


def spread(passage: str, statements: Sequence[str], rng) -> tuple[str, list[float]]:
    """``passage`` with statement k inserted at a seeded sentence start inside the k-th of
    ``len(statements)`` equal character stretches (a word start where a stretch has no sentence start,
    the stretch's start where it has neither). Returns the text and each statement's depth (its start
    in the text over the text's length)."""
    n, size = len(statements), len(passage)
    ends = _SENTENCE_START.finditer(passage)
    sentences = [m.end() for m in ends if not _TITLE.search(passage[max(0, m.start() - 8) : m.end()])]
    words = [m.end() for m in _WORD_START.finditer(passage)]
    points = []
    for k in range(n):
        lo, hi = k * size // n, (k + 1) * size // n
        inside = [p for p in sentences if lo <= p < hi] or [p for p in words if lo <= p < hi] or [lo]
        points.append(rng.choice(inside))
    pieces, starts, at, length = [], [], 0, 0
    for point, text in zip(points, statements):
        pieces.append(passage[at:point])
        length += point - at
        gap = "" if point == 0 or passage[point - 1].isspace() else " "
        starts.append(length + len(gap))
        pieces.append(f"{gap}{text} ")
        length += len(gap) + len(text) + 1
        at = point
    pieces.append(passage[at:])
    out = "".join(pieces)
    return out, [round(s / len(out), 4) for s in starts]


class SpreadRecall(Recall):
    name = "decode/recall_spread"
    description = (
        "facts spread through a long passage (use --context-len 1024), N tokens of FullKV's continuation, "
        "then several questions in one turn"
    )
    metric = "exact match % per question (a sample scores the mean of its questions)"
    facts: ClassVar[int] = 8
    questions: ClassVar[int] = 3
    max_new_tokens = 12 * 3
    version = "1"

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        check_request(n_samples, context_len)
        docs = [t for t in as_texts(haystack_texts) if t.strip()]
        if not docs:
            raise ValueError(f"{self.name} needs held-out document text")
        chat = has_chat_template(tokenizer)
        samples = []
        for index in range(n_samples):
            rng = sample_rng(seed, self.name, index)
            names = rng.sample(NAMES, self.facts)
            numbers = [str(v) for v in rng.sample(range(10000, 100000), self.facts)]
            asked = [names[i] for i in rng.sample(range(self.facts), self.questions)]
            facts = [statement(n, v) for n, v in zip(names, numbers)]
            fixed = len(_prompt_ids(tokenizer, HEAD + " ".join(facts) + " ", "", chat))
            if context_len - fixed < 4 * self.facts:
                raise ValueError(f"context length {context_len} is too short for {self.name} ({fixed} fixed tokens)")
            window, where = _prose_window(tokenizer, docs, context_len - fixed, rng)
            context_ids, depths = self._fit(tokenizer, window, facts, chat, context_len, rng)
            question, prefix = self.question(asked)
            by_name = dict(zip(names, numbers))
            sample = Sample(
                id=f"{self.name}:{seed}:{index}",
                task=self.name,
                chat=chat,
                context_ids=context_ids,
                question=_question_text(tokenizer, HEAD, question, prefix, chat),
                answers=[by_name[n] for n in asked],
                answer_prefix=prefix,
                max_new_tokens=self.max_new_tokens,
                meta={
                    **where,
                    "context_len": context_len,
                    "generate_len": self.generate_len,
                    "facts": facts,
                    "depths": depths,
                    "asked": asked,
                },
            )
            self.check(sample)
            samples.append(sample)
        return samples

    @staticmethod
    def _fit(tokenizer, window: list[int], facts: list[str], chat: bool, context_len: int, rng):
        """The prompt ids with the facts spread through the window's text, the window cut until the
        prompt fits ``context_len`` (re-tokenizing after the insertions can add a few tokens)."""
        state = rng.getstate()
        while True:
            rng.setstate(state)
            text, depths = spread(tokenizer.decode(window, skip_special_tokens=True), facts, rng)
            ids = _prompt_ids(tokenizer, HEAD, text, chat)
            over = len(ids) - context_len
            if over <= 0 or len(window) <= over:
                break
            window = window[: len(window) - over]
        if any(text.count(f) != 1 for f in facts):
            raise SampleCheckError(f"a fact is not stated exactly once in the passage: {facts}")
        return ids, depths

    @staticmethod
    def question(asked: Sequence[str]) -> tuple[str, str]:
        """The question turn after the generation (all asked names) and the answer prefix (the first name)."""
        listed = ", ".join(asked[:-1]) + f" and {asked[-1]}" if len(asked) > 1 else asked[0]
        text = f"What are the secret numbers of {listed}? Answer with one line per person, as name: number."
        return text, f"{asked[0]}:"

    def check(self, sample: Sample) -> None:
        DecodeTask.check(self, sample)  # Recall's own check is for one fact asked
        asked, facts = sample.meta.get("asked", []), sample.meta.get("facts", [])
        if len(asked) != self.questions or len(sample.answers) != len(asked) or len(set(sample.answers)) != len(asked):
            raise SampleCheckError(f"{sample.id}: needs {self.questions} questions with distinct answers")
        if any(statement(n, v) not in facts for n, v in zip(asked, sample.answers)):
            raise SampleCheckError(f"{sample.id}: a fact asked about is not in the prompt")

    @staticmethod
    def hits(answer: str, sample: Sample) -> list[bool]:
        """Per question: whether the first number after the asked name (before any other asked name) in the
        answer prefix + the answer is that name's number."""
        text, asked = sample.answer_prefix + answer, sample.meta["asked"]
        found = {n: m.start() for n in asked if (m := re.search(rf"\b{re.escape(n)}\b", text))}
        out = []
        for name, number in zip(asked, sample.answers):
            if name not in found:
                out.append(False)
                continue
            start = found[name] + len(name)
            stop = min([p for p in found.values() if p > found[name]], default=len(text))
            got = re.search(r"\d+", text[start:stop])
            out.append(got is not None and got.group(0) == number)
        return out

    def score(self, predictions: Sequence[dict], samples: Sequence[Sample]) -> float:
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        if not samples:
            return 0.0
        per = [self.hits(p["answer"], s) for p, s in zip(predictions, samples)]
        return 100.0 * sum(sum(h) / len(h) for h in per) / len(samples)
