"""Retrieval-aware calibration samples: synthetic evidence in calibration-split prose, answer in the continuation.

Prose calibration cannot see what sparse retrieval needs: a layer whose cache drops one record of a
long context costs almost nothing on the next prose tokens. An *evidence sample* makes that cost
visible. It is built from one calibration window of :func:`~polykv_search.data.make_samples`
(``context_len + continuation_len`` consecutive tokens of a calibration-split document):

* the **context** is the window's first tokens with ``records`` evidence statements of one kind
  inserted at seeded random sentence boundaries, cut to exactly ``context_len`` tokens;
* the **continuation** starts with a query that names one statement's key, then that statement's
  value (the **answer**), a full stop, and the window's next prose tokens up to ``continuation_len``.

Three kinds, cycled over the evidence samples (formats and vocabularies of their own, shared with
nothing in the RULER generators of :mod:`polykv_search.evaluation.ruler`, so that scoring on ruler
stays a held-out test)::

    record  Crate KX-318 holds saffron.                 query "Crate KX-318 holds" -> " saffron"
    code    The north granary opens with R7K29.         query "The north granary opens with" -> " R7K29"
    fact    Odalys Marchbank lives in Marlowick.        query "Odalys Marchbank lives in" -> " Marlowick"

Every piece (prefix, key, relation, value) is tokenized on its own and the ids are concatenated, so
the key and the answer have the same token ids in the evidence and in the continuation. Each sample
is checked on construction: no key or value of its statements occurs in its prose (text, case
folded), the answer's token run occurs exactly once in the context, inside the queried statement,
and the query names exactly one statement; a draw that fails is redrawn.

The signals of an evidence sample are computed on its **answer tokens only**
(:attr:`EvidenceSample.scored`, positions of the continuation): the query and the prose after the
answer are predictable without the evidence and would dilute what a layer's eviction of it costs.
A prose sample scores every continuation token (:func:`scored_span`).

Everything is seeded: the windows by ``seed`` (as :func:`make_samples`), each evidence sample's
draws by ``(seed, index)``; the same inputs give the same samples.

>>> mix = parse_retrieval_mix("0.5")                                     # doctest: +SKIP
>>> samples = make_calibration_samples(tok, corpus, n_samples=8, context_len=512,
...                                    continuation_len=32, seed=0, mix=mix)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polykv_search.protocol import AGNOSTIC, AWARE, check_protocol

from .corpus import Corpus
from .errors import DataError
from .evidence_mix import DEFAULT_RECORDS, RetrievalMix, parse_retrieval_mix
from .evidence_vocab import (  # noqa: F401  (the vocabularies, re-exported)
    BUILDINGS,
    CAPACITY,
    CODE_LETTERS,
    COMMODITIES,
    FIRST_NAMES,
    KEY_LETTERS,
    KINDS,
    QUALIFIERS,
    SURNAMES,
    TOWNS,
    distinct_pairs,
    draw_pair,
)
from .samples import Sample, encode_document, make_samples

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Bumped whenever a seed's samples change; recorded in the provenance.
GENERATOR_VERSION = 1
_TITLE = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|Col|Capt|Rev)\.$")


@dataclass(frozen=True)
class EvidenceKind:
    """One evidence format: ``{prefix} {key} {relation} {value}.``; the query is
    ``{query_prefix} {key} {relation}`` and the answer `` {value}``."""

    name: str
    prefix: str
    query_prefix: str
    relation: str


FORMATS: dict[str, EvidenceKind] = {
    "record": EvidenceKind("record", " Crate", "\nCrate", " holds"),
    "code": EvidenceKind("code", " The", "\nThe", " opens with"),
    "fact": EvidenceKind("fact", "", "\n", " lives in"),
}


def statement_text(kind: str, key: str, value: str) -> str:
    """The evidence statement as text (what :class:`EvidenceSample` inserts, up to tokenization)."""
    f = FORMATS[kind]
    return f"{f.prefix} {key}{f.relation} {value}.".lstrip()


def query_text(kind: str, key: str) -> str:
    """The query that opens the continuation (the answer follows it)."""
    f = FORMATS[kind]
    return f"{f.query_prefix} {key}{f.relation}"


# ---------------------------------------------------------------------------------- samples
@dataclass
class EvidenceSample(Sample):
    """A calibration window with inserted evidence (see the module docstring).

    Attributes
    ----------
    kind : str
        One of :data:`KINDS`.
    statements : list[tuple[str, str]]
        ``(key, value)`` of every inserted statement, in context order.
    queried : int
        Index into ``statements`` of the one the continuation asks for.
    evidence_spans : list[tuple[int, int]]
        ``[start, end)`` context positions of each statement's tokens.
    scored : tuple[int, int]
        ``[start, end)`` continuation positions of the answer: the tokens the signals score.
    prose_context : int
        Prose tokens in the context (``context_len`` minus the statements').
    filler_start : int
        First continuation position of the prose after the answer's full stop.
    protocol : str
        Where the query is: the continuation's start (question-agnostic) or the context's end
        (question-aware, ``collect --question-aware``); the context and continuation lengths are the same.
    """

    kind: str
    statements: list[tuple[str, str]]
    queried: int
    evidence_spans: list[tuple[int, int]]
    scored: tuple[int, int]
    prose_context: int
    filler_start: int
    #: ``question-agnostic``: the query opens the continuation; ``question-aware``: it closes the context
    #: (inside the compressed prompt) and the continuation opens with the answer (:mod:`polykv_search.protocol`)
    protocol: str = AGNOSTIC

    @property
    def answer(self) -> str:
        return self.statements[self.queried][1]

    @property
    def key(self) -> str:
        return self.statements[self.queried][0]

    def prose_ids(self) -> list[int]:
        """The prose tokens the sample uses, in document order (the context without its evidence,
        then the continuation after the answer and its full stop): consecutive tokens of ``doc_id``
        from ``offset``."""
        out, at = [], 0
        for a, b in self.evidence_spans:
            out += self.context_ids[at:a]
            at = b
        query = len(self.context_ids) - self.prose_context - sum(b - a for a, b in self.evidence_spans)
        out += self.context_ids[at : len(self.context_ids) - query]  # question-aware: the query closes it
        return out + self.continuation_ids[self.filler_start :]


def scored_span(sample: Any) -> tuple[int, int]:
    """``[start, end)`` of the continuation positions whose signals count: an evidence sample's
    answer, or every continuation token of any other sample."""
    span = getattr(sample, "scored", None)
    return (int(span[0]), int(span[1])) if span is not None else (0, len(sample.continuation_ids))


def _sample_rng(seed: int, index: int) -> random.Random:
    digest = hashlib.sha256(f"polykv-evidence\x00v{GENERATOR_VERSION}\x00{seed}\x00{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _runs(haystack: Sequence[int], needle: Sequence[int]) -> list[int]:
    k = len(needle)
    return [i for i in range(len(haystack) - k + 1) if list(haystack[i : i + k]) == list(needle)]


class _Pieces:
    """Tokenizes pieces once (pieces are short and repeat)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = encode_document(self.tokenizer, text) if text else []
        return self._cache[text]

    def text(self, token: int) -> str:
        key = f"\x00{token}"
        if key not in self._cache:
            self._cache[key] = self.tokenizer.decode([int(token)])
        return self._cache[key]

    def boundaries(self, ids: Sequence[int]) -> list[int]:
        """Positions just after a sentence: a token ending in ``.``, ``!`` or ``?`` (maybe quoted),
        followed by a token that starts with whitespace, and not a title such as ``Mr.``."""
        out = []
        for i in range(len(ids) - 1):
            if self.text(ids[i]).rstrip("\"')]_").endswith((".", "!", "?")) and self.text(ids[i + 1])[:1].isspace():
                if not _TITLE.search("".join(self.text(t) for t in ids[max(0, i - 3) : i + 1])):
                    out.append(i + 1)
        return out


def evidence_sample(
    window: Sample,
    pieces: _Pieces,
    kind: str,
    records: int,
    rng: random.Random,
    attempts: int = 50,
    protocol: str = AGNOSTIC,
) -> EvidenceSample:
    """Turn a prose ``window`` (of ``make_samples``) into an evidence sample of ``kind``; under
    ``question-aware`` the query closes the context instead of opening the continuation."""
    aware = check_protocol(protocol) == AWARE
    n, m = len(window.context_ids), len(window.continuation_ids)
    prose = list(window.context_ids) + list(window.continuation_ids)
    f = FORMATS[kind]
    for _ in range(attempts):
        pairs = distinct_pairs(kind, records, rng)  # bounded; a kind's vocabulary limits ``records``
        queried = rng.randrange(records)
        stmts = [
            pieces(f.prefix) + pieces(f" {k}") + pieces(f.relation) + pieces(f" {v}") + pieces(".") for k, v in pairs
        ]
        key, answer = pairs[queried]
        query = pieces(f.query_prefix) + pieces(f" {key}") + pieces(f.relation)
        answer_ids, end = pieces(f" {answer}"), pieces(".")
        evidence = sum(len(s) for s in stmts)
        p = n - evidence - (len(query) if aware else 0)
        tail = (0 if aware else len(query)) + len(answer_ids) + len(end)
        if p < n // 2:
            raise DataError(
                f"context_len {n} is too short for {records} evidence records of {evidence} tokens "
                "(keep them under half of it)"
            )
        if tail > m:
            raise DataError(
                f"continuation_len {m} is too short for evidence samples: the query and answer take {tail} tokens; "
                f"use a continuation of at least {tail} tokens (more leaves room for longer draws)"
            )
        ctx_prose, filler = prose[:p], prose[p : p + m - tail]
        text = pieces.tokenizer.decode(ctx_prose + filler).casefold()
        if any(k.casefold() in text or v.casefold() in text for k, v in pairs):
            continue
        spots = pieces.boundaries(ctx_prose)
        spots = (
            sorted(rng.sample(spots, records))
            if len(spots) >= records
            else sorted(rng.sample(range(1, p + 1), records))
        )
        context, spans, at = [], [], 0
        for spot, stmt in zip(spots, stmts):
            context += ctx_prose[at:spot]
            spans.append((len(context), len(context) + len(stmt)))
            context += stmt
            at = spot
        context += ctx_prose[at:]
        continuation = (answer_ids if aware else query + answer_ids) + end + filler
        q0, q1 = spans[queried]
        hits = _runs(context, answer_ids)
        key_hits = _runs(context, pieces(f" {key}"))
        if hits != [q1 - len(end) - len(answer_ids)] or len(key_hits) != 1 or not q0 <= key_hits[0] < q1:
            continue
        if aware:
            context += query
        sample = EvidenceSample(
            context_ids=context,
            continuation_ids=continuation,
            doc_id=window.doc_id,
            offset=window.offset,
            kind=kind,
            statements=pairs,
            queried=queried,
            evidence_spans=spans,
            scored=(tail - len(answer_ids) - len(end), tail - len(end)),
            prose_context=p,
            filler_start=tail,
            protocol=protocol,
        )
        assert len(context) == n and len(continuation) == m
        return sample
    raise DataError(
        f"could not place {kind} evidence in window {window.doc_id}@{window.offset} (its prose uses "
        "every drawn key or value)"
    )


def make_calibration_samples(
    tokenizer: PreTrainedTokenizerBase,
    corpus: Corpus,
    *,
    n_samples: int,
    context_len: int,
    continuation_len: int,
    seed: int,
    mix: RetrievalMix | None = None,
    protocol: str = AGNOSTIC,
) -> list[Sample]:
    """``n_samples`` calibration samples, the last ``mix.evidence_samples(n_samples)`` of which
    carry evidence (their query opens the continuation, or closes the context under ``protocol``
    ``question-aware``).

    The windows are :func:`make_samples`'s (``role="calib"``, the same ``seed``), so with no mix
    this *is* ``make_samples``, and with a mix the prose samples are the same leading windows. The
    evidence samples cycle through :data:`KINDS`; each draws from its own seeded RNG.

    Raises
    ------
    DataError
        A mix that asks for more samples than ``n_samples``, or lengths too short for the evidence.
    """
    k = mix.evidence_samples(n_samples, context_len) if mix is not None else 0  # checked before any draw
    samples = make_samples(
        tokenizer,
        corpus,
        n_samples=n_samples,
        context_len=context_len,
        continuation_len=continuation_len,
        seed=seed,
        role="calib",
    )
    if not k:
        return samples
    pieces = _Pieces(tokenizer)
    for j, index in enumerate(range(n_samples - k, n_samples)):
        samples[index] = evidence_sample(
            samples[index], pieces, KINDS[j % len(KINDS)], mix.records, _sample_rng(seed, index), protocol=protocol
        )
    return samples


def describe_evidence(samples: Sequence[Any], mix: RetrievalMix | None = None) -> dict[str, Any]:
    """A JSON-ready record of the mix: counts, which samples carry evidence, their keys and answers,
    and what the signals score."""
    evidence = [(i, s) for i, s in enumerate(samples) if isinstance(s, EvidenceSample)]
    out: dict[str, Any] = {
        "mix": mix.spec if mix is not None else ("0" if not evidence else None),
        "evidence_samples": len(evidence),
        "prose_samples": len(samples) - len(evidence),
        "scored": "evidence samples: the answer tokens only; prose samples: every continuation token",
    }
    if evidence:
        protocols = sorted({s.protocol for _, s in evidence})
        out.update(
            # where the query sits: the continuation's start, or the compressed prompt's end (question-aware)
            protocol=protocols[0] if len(protocols) == 1 else protocols,
            generator="polykv_search.data.evidence",
            generator_version=GENERATOR_VERSION,
            records_per_sample=mix.records if mix is not None else len(evidence[0][1].statements),
            kinds={k: sum(s.kind == k for _, s in evidence) for k in KINDS},
            samples=[
                {
                    "index": i,
                    "kind": s.kind,
                    "key": s.key,
                    "answer": s.answer,
                    "scored": list(s.scored),
                    "evidence_spans": [list(x) for x in s.evidence_spans],
                }
                for i, s in evidence
            ],
        )
    return out


__all__ = [
    "DEFAULT_RECORDS",
    "FORMATS",
    "GENERATOR_VERSION",
    "CAPACITY",
    "KINDS",
    "EvidenceSample",
    "RetrievalMix",
    "describe_evidence",
    "evidence_sample",
    "make_calibration_samples",
    "parse_retrieval_mix",
    "query_text",
    "scored_span",
    "statement_text",
]
