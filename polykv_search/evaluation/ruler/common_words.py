"""Common-words extraction: name the most frequent words of a long numbered list."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import ClassVar

from polykv_search.evaluation.base import SampleCheckError
from polykv_search.evaluation.ruler.base import RulerTask, use_fewshot
from polykv_search.evaluation.ruler.haystack import ADJECTIVES, NOUNS, draw_distinct
from polykv_search.evaluation.samples import Sample

CWE_CONTEXT = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
CWE_QUESTION = "Question: What are the {num_cw} most common words in the above list?"
CWE_PREFIX = " Answer: The top {num_cw} words that appear most often in the list are:"
_CWE_WORD = re.compile(r"^[a-z]{3,12}$")
_CWE_ITEM = re.compile(r"(\d+)\. ([a-z]+)")


_PSEUDO: list[str] = []


def pseudo_words(count: int) -> list[str]:
    """The first ``count`` of a fixed sequence of pronounceable made-up words (CVCV...)."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    if len(_PSEUDO) < count:
        rng = random.Random(20240406)
        draw = lambda: "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))  # noqa: E731
        syllables = len(consonants) * len(vowels)
        words = draw_distinct(draw, count, set(), "made-up words", sum(syllables**n for n in (2, 3, 4)))
        _PSEUDO[:] = words
    return _PSEUDO[:count]


@lru_cache(maxsize=4)
def _vocabulary(texts: tuple[str, ...]) -> tuple[str, ...]:
    words = {w for t in texts for w in t.split() if _CWE_WORD.match(w)}
    words.update(w for w in ADJECTIVES + NOUNS if _CWE_WORD.match(w))
    return tuple(sorted(words))


class CommonWordsExtraction(RulerTask):
    """Numbered word list where 10 words repeat most often; name them (RULER cwe)."""

    name = "ruler/cwe"
    description = "common words extraction: the 10 most frequent words of a numbered list"
    max_new_tokens = 120
    num_cw: ClassVar[int] = 10
    freq_cw: ClassVar[int] = 30
    freq_ucw: ClassVar[int] = 3
    #: RULER's settings below 4096 tokens: (common, uncommon) repeats 6 and 1.
    short_freq: ClassVar[tuple[int, int]] = (6, 1)
    short_threshold: ClassVar[int] = 4096
    #: RULER prepends one solved example; ``None`` does so from ``FEWSHOT_MIN_LEN`` tokens up.
    fewshot: ClassVar[bool | None] = None
    _unit_tokens_guess = 4.0

    @property
    def _min_size(self) -> int:  # type: ignore[override]
        return self.num_cw + 1

    def _check_feasible(self) -> None:
        reps = (self.freq_cw, self.freq_ucw), tuple(self.short_freq)
        if self.num_cw < 1 or any(not common > uncommon >= 1 for common, uncommon in reps):
            raise ValueError(f"{self.name}: needs >= 1 common words repeated more often than the others >= 1 times")

    @staticmethod
    def vocabulary(texts: Sequence[str]) -> list[str]:
        """Lowercase words (3-12 letters) of the haystack plus the built-in word lists, sorted."""
        return list(_vocabulary(tuple(texts)))

    def _example(self, rng, vocab: list[str], num_words: int, common_reps: int, uncommon_reps: int):
        if num_words <= len(vocab):
            chosen = rng.sample(vocab, num_words)
        else:  # vocabulary too small: made-up words fill the uncommon tail
            known = set(vocab)
            extra = [w for w in pseudo_words(2 * num_words) if w not in known][: num_words - len(vocab)]
            chosen = rng.sample(vocab, len(vocab)) + extra
        common, uncommon = chosen[: self.num_cw], chosen[self.num_cw :]
        word_list = common * common_reps + uncommon * uncommon_reps
        rng.shuffle(word_list)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common

    def _prepare(self, texts, context_len):
        return self.vocabulary(texts)

    def _builder(self, rng, vocab, index, seed, context_len):
        question = CWE_QUESTION.format(num_cw=self.num_cw)
        prefix = CWE_PREFIX.format(num_cw=self.num_cw)
        short = context_len < self.short_threshold
        reps = self.short_freq if short else (self.freq_cw, self.freq_ucw)
        state = rng.getstate()

        def build(n: int) -> Sample:
            local = random.Random()
            local.setstate(state)
            shots = ""
            if use_fewshot(self.fewshot, context_len):  # one solved example, smaller below 4096
                ctx, ans = self._example(local, vocab, 20, 3, 1) if short else self._example(local, vocab, 40, 10, 3)
                shots = (
                    CWE_CONTEXT
                    + ctx
                    + "\n"
                    + question
                    + prefix
                    + " "
                    + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ans))
                    + "\n"
                )
            ctx, answers = self._example(local, vocab, n, *reps)
            return self._sample(
                index,
                seed,
                context=shots + CWE_CONTEXT + ctx + "\n",
                question=question,
                answer_prefix=prefix,
                answers=list(answers),
                meta={"repeats": list(reps), "fewshot": bool(shots)},
            )

        return build

    def check(self, sample: Sample) -> None:
        main = sample.context[sample.context.rfind(CWE_CONTEXT) + len(CWE_CONTEXT) :]
        items = _CWE_ITEM.findall(main)
        if [int(i) for i, _ in items] != list(range(1, len(items) + 1)):
            raise SampleCheckError(f"{sample.id}: list numbering is broken")
        counts = Counter(w for _, w in items).most_common()
        if len(counts) <= self.num_cw:
            raise SampleCheckError(f"{sample.id}: too few distinct words")
        top = counts[: self.num_cw]
        if top[-1][1] <= counts[self.num_cw][1]:
            raise SampleCheckError(f"{sample.id}: no clear top {self.num_cw}")
        if sorted(w for w, _ in top) != sorted(sample.answers):
            raise SampleCheckError(f"{sample.id}: context gives {top}, answers are {sample.answers}")
