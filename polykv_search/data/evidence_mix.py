"""How many calibration samples carry evidence: ``--retrieval-mix`` as a count or a fraction.

>>> parse_retrieval_mix("0.5").evidence_samples(8)
4
>>> parse_retrieval_mix("3").evidence_samples(8)
3
>>> parse_retrieval_mix("0") is None
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import DataError
from .evidence_vocab import check_records

DEFAULT_RECORDS = 4


@dataclass(frozen=True)
class RetrievalMix:
    """How many calibration samples carry evidence: a ``count`` or a ``fraction`` of them.

    Attributes
    ----------
    spec : str
        As given (``"0.5"``, ``"3"``); recorded in the provenance.
    count, fraction
        Exactly one is set: ``count`` evidence samples, or ``round(fraction · n_samples)``.
    records : int
        Evidence statements per evidence sample (one is queried; the others are distractors).
    """

    spec: str
    count: int | None = None
    fraction: float | None = None
    records: int = DEFAULT_RECORDS

    def evidence_samples(self, n_samples: int, context_len: int | None = None) -> int:
        """The number of evidence samples among ``n_samples``; a one-line :class:`DataError` when
        the mix asks for more than there are, a positive fraction rounds to none, or ``records`` is
        more than the vocabularies of the kinds used can supply (or fit under half of ``context_len``)."""
        if self.count is not None:
            if self.count > n_samples:
                raise DataError(
                    f"retrieval mix {self.spec!r}: {self.count} evidence samples, but only {n_samples} samples"
                )
            k = self.count
        else:
            k = math.floor(self.fraction * n_samples + 0.5)
            if self.fraction > 0 and k == 0:
                raise DataError(
                    f"retrieval mix {self.spec!r} of {n_samples} samples rounds to 0 evidence samples; "
                    "give a count (e.g. 1) or more samples"
                )
        check_records(self.records, k, context_len)
        return k


def parse_retrieval_mix(value: str | int | float | None, *, records: int = DEFAULT_RECORDS) -> RetrievalMix | None:
    """``None``/``"0"`` → None (prose only); an integer (``"3"``) → a count; a decimal in [0, 1]
    (``"0.5"``, ``".25"``) or a percentage (``"50%"``) → a fraction of the samples."""
    if isinstance(records, bool) or not isinstance(records, int) or records < 1:
        raise DataError(f"evidence records per sample must be a positive integer, got {records!r}")
    if value is None:
        return None
    if isinstance(value, bool):
        raise DataError(f"retrieval mix must be a count or a fraction, got {value!r}")
    text = str(value).strip()
    try:
        if isinstance(value, int) or text.isdigit():
            count = int(text)
            return RetrievalMix(text, count=count, records=records) if count else None
        fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise DataError(
            f"retrieval mix {text!r}: expected a count (e.g. 2), a fraction in [0, 1] (e.g. 0.5) "
            "or a percentage (e.g. 25%)"
        ) from None
    if fraction < 0:
        raise DataError(f"retrieval mix {text!r}: must not be negative (a count such as 2, or a fraction in [0, 1])")
    if not math.isfinite(fraction) or not 0 <= fraction <= 1:
        raise DataError(f"retrieval mix {text!r}: a fraction must lie in [0, 1] (or give a whole count, e.g. 2)")
    return RetrievalMix(text, fraction=fraction, records=records) if fraction else None


__all__ = ["DEFAULT_RECORDS", "RetrievalMix", "parse_retrieval_mix"]
