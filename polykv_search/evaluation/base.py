"""The task protocol every suite implements."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from polykv_search.evaluation.samples import Sample

SUITES = ("broad", "ruler", "longbench", "decode")


class SampleCheckError(AssertionError):
    """A generated sample whose answer cannot be recovered from its context."""


class Task:
    """A named evaluation task: generates samples, scores predictions on them (0-100).

    Subclasses set the class attributes and implement :meth:`generate` and :meth:`score`.
    ``kind`` is ``"generate"`` (greedy decoding, predictions are strings), ``"teacher_forced"``
    (the continuation is scored token by token, predictions are dicts; see ``broad``) or
    ``"trajectory"`` (FullKV generates, entries are teacher-forced along it step by step; see ``decode``).
    """

    name: ClassVar[str] = ""
    suite: ClassVar[str] = ""
    description: ClassVar[str] = ""
    metric: ClassVar[str] = ""
    kind: ClassVar[str] = "generate"
    max_new_tokens: ClassVar[int] = 32
    #: True when the score depends on the first answer token only: under question-aware, the prompt call
    #: predicts it before any eviction, so every entry then scores what FullKV scores.
    first_token_decides: ClassVar[bool] = False
    #: Bumped whenever generated samples or scores change for the same inputs.
    version: ClassVar[str] = "1"

    def generate(
        self,
        tokenizer,
        haystack_texts: str | Sequence[str] | None,
        n_samples: int,
        context_len: int,
        seed: int,
    ) -> list[Sample]:
        raise NotImplementedError

    def score(self, predictions: Sequence[Any], samples: Sequence[Sample]) -> float:
        raise NotImplementedError

    def check(self, sample: Sample) -> None:
        """Raise :class:`SampleCheckError` unless the answer is recoverable from the context."""

    def extra_metrics(self, predictions: Sequence[Any], samples: Sequence[Sample]) -> dict[str, float]:
        """Numbers reported beside the score (e.g. perplexity)."""
        return {}

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "suite": self.suite,
            "description": self.description,
            "metric": self.metric,
            "kind": self.kind,
            "max_new_tokens": self.max_new_tokens,
            "version": self.version,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


# --------------------------------------------------------------------------- shared helpers
def sample_rng(seed: int, task: str, index: int) -> random.Random:
    """The RNG of sample ``index``: independent of how many samples are drawn, stable across runs."""
    digest = hashlib.sha256(f"{task}\x00{seed}\x00{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def split_seed(seed: int, role: str) -> int:
    """The seed a task draws its samples from on split ``role``: ``seed`` itself on the evaluation split (so
    evaluation samples never change), a seed derived from it on the calibration split, so that a calibration
    sample never shares its needles, keys or facts with the evaluation sample of the same index."""
    if role == "eval":
        return seed
    digest = hashlib.sha256(f"{role}\x00{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def as_texts(haystack_texts: str | Sequence[str] | None) -> list[str]:
    if haystack_texts is None:
        return []
    if isinstance(haystack_texts, str):
        return [haystack_texts]
    return [t for t in haystack_texts if isinstance(t, str)]


def check_request(n_samples: int, context_len: int) -> None:
    if not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    if not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"context_len must be a positive integer, got {context_len!r}")
