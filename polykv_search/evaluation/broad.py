"""The broad suite: wide-context understanding after a compressed context (LongBench-like side).

``broad/continuation``
    A held-out document is cut into a context of ``context_len`` tokens and the next
    ``continuation_len`` tokens. The context is prefilled in one call (and compressed), the
    continuation is teacher-forced in one call; the score is next-token accuracy (greedy argmax
    equals the true token) in percent over all continuation tokens, with perplexity beside it.
``broad/manyshot``
    Many-shot in-context classification: a fixed random assignment word -> label (fixed by the
    seed), hundreds of labelled ``Input: w / Label: l`` examples drawn from a pool of words so
    every word is seen several times, then one query word from the pool; accuracy of the first
    word of the answer.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from typing import ClassVar

from polykv_search.evaluation.base import SampleCheckError, Task, as_texts, check_request, sample_rng
from polykv_search.evaluation.ruler import ADJECTIVES, NOUNS
from polykv_search.evaluation.samples import Sample, grow_to_fit, prompt_length


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def bos_ids(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text (``[bos]`` or ``[]``)."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    if len(full) > len(plain) and full[-len(plain) :] == plain:
        return list(full[: len(full) - len(plain)])
    return []


# ============================================================================== continuation
class Continuation(Task):
    name = "broad/continuation"
    suite = "broad"
    kind = "teacher_forced"
    description = "teacher-forced next-token accuracy on the continuation of a held-out document"
    metric = "next-token accuracy % (ppl beside it)"
    max_new_tokens = 0
    continuation_len: ClassVar[int] = 64

    def __init__(self, continuation_len: int | None = None):
        if continuation_len is not None:
            if continuation_len < 1:
                raise ValueError("continuation_len must be positive")
            self.continuation_len = continuation_len

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        check_request(n_samples, context_len)
        docs = [t for t in as_texts(haystack_texts) if t.strip()]
        if not docs:
            raise ValueError("broad/continuation needs held-out document text")
        prefix = bos_ids(tokenizer)
        body = context_len - len(prefix)
        if body < 1:
            raise ValueError(f"context length {context_len} is too short")
        need = body + self.continuation_len
        samples = []
        for index in range(n_samples):
            rng = sample_rng(seed, self.name, index)
            order = list(range(len(docs)))
            rng.shuffle(order)
            window, where = None, {}
            for doc in order:
                found = self._window(tokenizer, docs[doc], need, rng)
                if found is not None:
                    window, where = found[0], {"document": doc, **found[1]}
                    break
            if window is None:  # no single document is long enough: use them all, in order
                stream = _encode(tokenizer, "\n\n".join(docs))
                if len(stream) < need:
                    raise ValueError(f"the held-out text has {len(stream)} tokens; {need} are needed for one sample")
                offset = rng.randint(0, len(stream) - need)
                window = stream[offset : offset + need]
                where = {"document": "all documents", "token_offset": offset}
            samples.append(
                Sample(
                    id=f"{self.name}:{seed}:{index}",
                    task=self.name,
                    chat=False,
                    context_ids=prefix + window[:body],
                    target_ids=window[body:],
                    max_new_tokens=0,
                    meta={**where, "context_len": context_len},
                )
            )
        return samples

    @staticmethod
    def _window(tokenizer, text: str, need: int, rng) -> tuple[list[int], dict] | None:
        """``need`` tokens of ``text`` starting at a seeded random word, or None if it is too short.

        Only a slice of the document is tokenized (documents can be whole novels); the slice starts
        after a whitespace so the first token is a word start, and it grows until it holds ``need``.
        """
        span = 8 * need + 256  # characters; ~4 per token in English prose, doubled for safety
        while True:
            if span >= len(text):
                ids = _encode(tokenizer, text)
                if len(ids) < need:
                    return None
                start = rng.randint(0, len(ids) - need)
                return ids[start : start + need], {"token_offset": start}
            offset = rng.randint(0, len(text) - span)
            space = text.find(" ", offset, offset + 200)
            offset = space + 1 if space >= 0 else offset
            ids = _encode(tokenizer, text[offset : offset + span])
            if len(ids) > need:  # the last token may be cut by the slice's end: never use it
                return ids[:need], {"char_offset": offset}
            span *= 2

    def check(self, sample: Sample) -> None:
        if not sample.context_ids or not sample.target_ids or len(sample.target_ids) != self.continuation_len:
            raise SampleCheckError(f"{sample.id}: malformed continuation sample")

    @staticmethod
    def _totals(predictions: Sequence[dict]) -> tuple[int, int, float]:
        correct = sum(int(p["correct"]) for p in predictions)
        total = sum(int(p["total"]) for p in predictions)
        nll = sum(float(p["nll"]) for p in predictions)
        return correct, total, nll

    def score(self, predictions: Sequence[dict], samples: Sequence[Sample]) -> float:
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        correct, total, _ = self._totals(predictions)
        return 100.0 * correct / total if total else 0.0

    def extra_metrics(self, predictions, samples) -> dict[str, float]:
        _, total, nll = self._totals(predictions)
        extra = {"ppl": math.exp(nll / total) if total else float("nan"), "tokens": float(total)}
        for key in ("kl", "dnll"):  # fidelity to FullKV, mean over samples (all have the same length)
            values = [float(p[key]) for p in predictions if key in p]
            if values and len(values) == len(predictions):
                extra[key] = sum(values) / len(values)
        return extra


# ================================================================================== manyshot
MANYSHOT_LABELS = ("north", "south", "east", "west", "left", "right")
MANYSHOT_HEADER = (
    "Every input word belongs to one category: {labels}. "
    "The labelled examples below show the category of each word.\n\n"
)
_EXAMPLE = re.compile(r"Input: (\S+)\nLabel: (\S+)\n")


class ManyShotClassification(Task):
    name = "broad/manyshot"
    suite = "broad"
    description = "many-shot in-context classification of words under a seeded random labelling"
    metric = "accuracy % (first word of the answer)"
    max_new_tokens = 4
    first_token_decides = True  # a one-word label (its first word is scored)
    pool_size: ClassVar[int] = 64
    labels: ClassVar[tuple[str, ...]] = MANYSHOT_LABELS

    def mapping(self, seed: int) -> dict[str, str]:
        """The fixed random assignment word -> label of this seed."""
        rng = sample_rng(seed, self.name, -1)
        words = sorted(set(ADJECTIVES + NOUNS) - set(self.labels))
        return {w: rng.choice(self.labels) for w in words}

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        check_request(n_samples, context_len)
        if len(set(self.labels)) < 2 or self.pool_size < 1 or not set(ADJECTIVES + NOUNS) - set(self.labels):
            raise ValueError(f"{self.name}: needs 2 or more distinct labels, a pool of 1 or more words, and words")
        mapping = self.mapping(seed)
        words = sorted(mapping)
        header = MANYSHOT_HEADER.format(labels=", ".join(self.labels))
        samples = []
        for index in range(n_samples):
            rng = sample_rng(seed, self.name, index)
            pool = rng.sample(words, min(self.pool_size, len(words)))
            query = rng.choice(pool)
            depth = rng.random()
            stream_rng_state = rng.getstate()

            def build(n: int, _state=stream_rng_state, _pool=pool, _query=query, _depth=depth) -> Sample:
                local = random.Random()
                local.setstate(_state)
                items = [local.choice(_pool) for _ in range(n)]
                if _query not in items:  # the query word is shown at least once, at a seeded depth
                    items[min(int(_depth * n), n - 1)] = _query
                examples = "".join(f"Input: {w}\nLabel: {mapping[w]}\n" for w in items)
                return Sample(
                    id=f"{self.name}:{seed}:{index}",
                    task=self.name,
                    context=header + examples,
                    question=f"Input: {_query}\nLabel:",
                    answers=[mapping[_query]],
                    chat=False,
                    max_new_tokens=self.max_new_tokens,
                    meta={"query": _query, "labels": list(self.labels)},
                )

            measure = lambda s: prompt_length(tokenizer, s)  # noqa: E731
            sample, n = grow_to_fit(build, measure, context_len, 1, 64)
            sample.meta.update(examples=n, prompt_tokens=measure(sample), context_len=context_len)
            self.check(sample)
            samples.append(sample)
        return samples

    def check(self, sample: Sample) -> None:
        seen: dict[str, str] = {}
        for word, label in _EXAMPLE.findall(sample.context):
            if seen.setdefault(word, label) != label:
                raise SampleCheckError(f"{sample.id}: {word!r} has two labels")
        query = sample.meta["query"]
        if seen.get(query) != sample.answers[0]:
            raise SampleCheckError(f"{sample.id}: context gives {seen.get(query)!r} for {query!r}")

    @staticmethod
    def first_word(prediction: str) -> str:
        words = re.findall(r"[a-z]+", prediction.strip().split("\n")[0].lower())
        return words[0] if words else ""

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> float:
        if len(predictions) != len(samples):
            raise ValueError(f"{len(predictions)} predictions for {len(samples)} samples")
        if not samples:
            return 0.0
        hits = sum(self.first_word(p) == s.answers[0] for p, s in zip(predictions, samples))
        return 100.0 * hits / len(samples)


BROAD_TASKS: tuple[type[Task], ...] = (Continuation, ManyShotClassification)
