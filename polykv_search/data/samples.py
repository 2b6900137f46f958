"""Calibration/evaluation samples: a context of n tokens followed by a continuation of m tokens."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .corpus import Corpus, Document
from .errors import DataError
from .splits import describe_split, split_corpus

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class Sample:
    """One window cut from a tokenized document.

    Attributes
    ----------
    context_ids : list[int]
        Exactly ``context_len`` token ids.
    continuation_ids : list[int]
        Exactly ``continuation_len`` token ids, immediately following the context.
    doc_id : str
        The document (of the role's split) the window comes from.
    offset : int
        Token offset of the context's first token in that document.
    """

    context_ids: list[int]
    continuation_ids: list[int]
    doc_id: str
    offset: int


def encode_document(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (no BOS/EOS), with no length warning."""
    try:
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    except TypeError:  # tokenizers without the `verbose` keyword
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids]


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")


def make_samples(
    tokenizer: PreTrainedTokenizerBase,
    corpus: Corpus,
    *,
    n_samples: int,
    context_len: int,
    continuation_len: int,
    seed: int,
    role: str = "calib",
) -> list[Sample]:
    """Cut ``n_samples`` random, non-overlapping windows from the ``role`` side of the corpus.

    Each document of :func:`split_corpus(corpus, role) <split_corpus>` is tokenized once with
    ``tokenizer`` (no special tokens). Windows of ``context_len + continuation_len`` tokens are
    spread over documents in proportion to their free room and placed at random offsets, without
    overlapping, all under ``random.Random(seed)``: the same inputs give the same samples.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        Called as ``tokenizer(text, add_special_tokens=False)["input_ids"]``.
    corpus : Corpus
    n_samples, context_len : int
        At least 1.
    continuation_len : int
        At least 0.
    seed : int
    role : {"calib", "eval"}
        Which side of the split to sample; the two never share a document.

    Returns
    -------
    list[Sample]
        In random order. Record :func:`describe_samples` (or :func:`describe_split` and
        :func:`samples_fingerprint`) beside results computed from them.

    Raises
    ------
    DataError
        When the role's documents cannot hold ``n_samples`` non-overlapping windows.
    """
    _check_int("n_samples", n_samples, 1)
    _check_int("context_len", context_len, 1)
    _check_int("continuation_len", continuation_len, 0)
    docs: list[Document] = split_corpus(corpus, role)
    window = context_len + continuation_len
    tokens = [encode_document(tokenizer, d.text) for d in docs]
    capacity = [len(t) // window for t in tokens]
    if sum(capacity) < n_samples:
        longest = max(len(t) for t in tokens)
        raise DataError(
            f"corpus {corpus.spec or corpus.name!r} is too short: its {role} documents ({len(docs)}, "
            f"longest {longest} tokens) hold {sum(capacity)} non-overlapping windows of "
            f"{context_len}+{continuation_len} tokens, {n_samples} requested"
        )
    rng = random.Random(seed)
    counts = [0] * len(docs)
    for _ in range(n_samples):
        room = [c - k for c, k in zip(capacity, counts)]
        counts[rng.choices(range(len(docs)), weights=room)[0]] += 1
    samples = []
    for doc, ids, k in zip(docs, tokens, counts):
        if not k:
            continue
        slack = len(ids) - k * window
        gaps = sorted(rng.randint(0, slack) for _ in range(k))
        for i, gap in enumerate(gaps):
            start = gap + i * window
            samples.append(
                Sample(
                    context_ids=ids[start : start + context_len],
                    continuation_ids=ids[start + context_len : start + window],
                    doc_id=doc.id,
                    offset=start,
                )
            )
    rng.shuffle(samples)
    return samples


def samples_fingerprint(samples: list[Sample]) -> str:
    """A short (16 hex digits) sha256 of the samples' documents, offsets and token ids, in order."""
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s.doc_id, s.offset, s.context_ids, s.continuation_ids]).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:16]


def describe_samples(
    samples: list[Sample], corpus: Corpus, *, role: str, seed: int, **settings: Any
) -> dict[str, object]:
    """A JSON-ready provenance record: the split, the seed and settings, and each window's place.

    Parameters
    ----------
    samples : list[Sample]
        From :func:`make_samples`.
    corpus : Corpus
    role : {"calib", "eval"}
    seed : int
    **settings
        Anything else worth recording (``context_len``, ``continuation_len``, the tokenizer...).
    """
    return {
        "split": describe_split(corpus, role),
        "seed": seed,
        **settings,
        "n_samples": len(samples),
        "fingerprint": samples_fingerprint(samples),
        "windows": [[s.doc_id, s.offset] for s in samples],
    }
