"""What every RULER task shares: grow the haystack until the prompt fills the context, then check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from polykv_search.evaluation.base import Task, as_texts, check_request, sample_rng
from polykv_search.evaluation.metrics import ruler_postprocess, string_match_all
from polykv_search.evaluation.ruler.haystack import haystack_of
from polykv_search.evaluation.samples import Sample, grow_to_fit, prompt_length

#: Below this context length (tokens) vt and cwe leave out RULER's solved example, which alone
#: takes a few hundred tokens.
FEWSHOT_MIN_LEN = 1024


def use_fewshot(setting: bool | None, context_len: int) -> bool:
    return context_len >= FEWSHOT_MIN_LEN if setting is None else bool(setting)


class RulerTask(Task):
    suite: ClassVar[str] = "ruler"
    metric: ClassVar[str] = "string_match_all"
    #: Tokens per haystack unit (word, noise line, list word), a guess for the first size probe.
    _unit_tokens_guess: ClassVar[float] = 1.5

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        check_request(n_samples, context_len)
        self._check_feasible()  # what the task's vocabularies can supply, before anything is drawn
        shared = self._prepare(as_texts(haystack_texts), context_len)
        samples = []
        for index in range(n_samples):
            rng = sample_rng(seed, self.name, index)
            build = self._builder(rng, shared, index, seed, context_len)
            measure = lambda s: prompt_length(tokenizer, s)  # noqa: E731
            guess = int(context_len / self._unit_tokens_guess) + 1
            sample, size = grow_to_fit(build, measure, context_len, self._min_size, guess)
            sample.meta["haystack_size"] = size
            sample.meta["prompt_tokens"] = measure(sample)
            sample.meta["context_len"] = context_len
            self.check(sample)
            samples.append(sample)
        return samples

    _min_size: ClassVar[int] = 1

    def _check_feasible(self) -> None:
        """``ValueError`` when the task's settings ask for more than its vocabularies can supply."""

    def _prepare(self, texts: list[str], context_len: int) -> Any:
        """State shared by all samples of one generation (default: the haystack)."""
        return haystack_of(tuple(texts))

    def _builder(self, rng, shared: Any, index: int, seed: int, context_len: int) -> Callable[[int], Sample]:
        """Draw the sample's random choices from ``rng``; return ``size -> Sample``."""
        raise NotImplementedError

    def _sample(self, index: int, seed: int, **fields: Any) -> Sample:
        fields.setdefault("max_new_tokens", self.max_new_tokens)
        return Sample(id=f"{self.name}:{seed}:{index}", task=self.name, **fields)

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> float:
        return string_match_all([ruler_postprocess(p) for p in predictions], [s.answers for s in samples])
