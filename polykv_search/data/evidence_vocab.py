"""The vocabularies of the evidence generator (:mod:`polykv_search.data.evidence`) and what they can supply.

An evidence sample holds ``records`` statements with pairwise distinct keys *and* distinct values, so
a kind can hold at most as many records as its smaller vocabulary (keys or values) has members:
:data:`CAPACITY`. :func:`check_records` refuses a request beyond it *before* anything is drawn, and
:func:`distinct_pairs` draws with a bounded loop, so no request can make the generator draw forever.

>>> CAPACITY["fact"], CAPACITY["record"]
(19, 39)
"""

from __future__ import annotations

import random

from .errors import DataError

KINDS: tuple[str, ...] = ("record", "code", "fact")

COMMODITIES = (
    "saffron indigo pewter cinnamon tallow nutmeg barley hemp cobalt cloves juniper molasses alum "
    "borax camphor sulphur quinine mica flax lanolin paraffin turpentine resin vermilion ochre umber "
    "gypsum potash sorghum millet jute sisal kelp caraway anise fennel tamarind vetch spelt"
).split()
KEY_LETTERS = "BCDFGHJKLMNPQRSTVWXZ"
CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
QUALIFIERS = "north south east west upper lower inner outer".split()
BUILDINGS = (
    "granary boathouse tannery smithy dovecote brewhouse icehouse saddlery "
    "foundry armoury malthouse ropewalk kiln sawmill cooperage apiary forge"
).split()
FIRST_NAMES = (
    "Odalys Perrin Tamsin Ulric Wendeline Corvin Isolde Briony Caspian Elowen Galen Ivo Linnea "
    "Mireille Oriel Quentin Sabine Verity"
).split()
SURNAMES = (
    "Ashgrove Pennicott Marchbank Thistlewood Brackenridge Hollinsworth Oakhurst "
    "Ravensworth Fellgate Grimsditch Nettlefold Pemberthy Rookwood"
).split()
TOWNS = (
    "Marlowick Dunsmere Felthorpe Ashcombe Brindlewick Caddington Elmsford Gorsebury Hollowmere "
    "Kettleby Lindenford Morrowdale Nethercombe Oxlade Pellingham Rushwick Thornley Upwick "
    "Wyvernhall"
).split()

#: per kind: (distinct keys, distinct values, what limits it) as :func:`draw_pair` draws them
_SIZES: dict[str, tuple[int, int, str]] = {
    "record": (len(KEY_LETTERS) ** 2 * 900, len(COMMODITIES), f"{len(COMMODITIES)} commodities"),
    "code": (
        len(QUALIFIERS) * len(BUILDINGS),
        len(CODE_LETTERS) ** 2 * 9 * 90,
        f"{len(QUALIFIERS) * len(BUILDINGS)} qualified buildings",
    ),
    "fact": (len(FIRST_NAMES) * len(SURNAMES), len(TOWNS), f"{len(TOWNS)} towns"),
}
#: the most statements one evidence sample of each kind can hold (distinct keys and distinct values)
CAPACITY: dict[str, int] = {kind: min(keys, values) for kind, (keys, values, _) in _SIZES.items()}
#: every statement is at least this many tokens (prefix, key, relation, value and full stop are
#: tokenized on their own; the fact kind has no prefix)
MIN_STATEMENT_TOKENS = 4


def draw_pair(kind: str, rng: random.Random) -> tuple[str, str]:
    """One ``(key, value)`` of ``kind`` from ``rng``."""
    if kind == "record":
        key = "".join(rng.choice(KEY_LETTERS) for _ in range(2)) + f"-{rng.randint(100, 999)}"
        return key, rng.choice(COMMODITIES)
    if kind == "code":
        code = f"{rng.choice(CODE_LETTERS)}{rng.randint(1, 9)}{rng.choice(CODE_LETTERS)}{rng.randint(10, 99)}"
        return f"{rng.choice(QUALIFIERS)} {rng.choice(BUILDINGS)}", code
    if kind == "fact":
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}", rng.choice(TOWNS)
    raise DataError(f"evidence kind {kind!r} is not one of {', '.join(KINDS)}")


def kinds_used(n_evidence: int) -> tuple[str, ...]:
    """The kinds ``n_evidence`` evidence samples cycle through."""
    return KINDS[: max(0, min(n_evidence, len(KINDS)))]


def check_records(records: int, n_evidence: int, context_len: int | None = None) -> None:
    """Refuse, before anything is drawn, ``records`` statements per evidence sample that the
    vocabularies of the kinds used cannot supply, or that cannot fit under half of ``context_len``.

    Raises
    ------
    DataError
        One line naming the limit.
    """
    for kind in kinds_used(n_evidence):
        _check_capacity(kind, records)
    if context_len is not None and n_evidence > 0:
        room = context_len - context_len // 2
        if records * MIN_STATEMENT_TOKENS > room:
            raise DataError(
                f"context_len {context_len} is too short for {records} evidence records (at least "
                f"{records * MIN_STATEMENT_TOKENS} tokens, which must stay under half of it: at most "
                f"{room // MIN_STATEMENT_TOKENS} records fit)"
            )


def _check_capacity(kind: str, records: int) -> None:
    if kind in CAPACITY and records > CAPACITY[kind]:
        raise DataError(
            f"evidence records per sample: {records} is more than a {kind} sample can hold (its vocabulary has "
            f"{_SIZES[kind][2]}: at most {CAPACITY[kind]} distinct statements); give at most {CAPACITY[kind]}"
        )


def distinct_pairs(kind: str, records: int, rng: random.Random) -> list[tuple[str, str]]:
    """``records`` pairs of ``kind`` with distinct keys and distinct values, drawn from ``rng`` in a
    bounded loop (a :class:`DataError`, never an endless loop, when the vocabulary runs out)."""
    _check_capacity(kind, records)
    pairs: list[tuple[str, str]] = []
    for _ in range(200 * records + 1000):
        if len(pairs) == records:
            return pairs
        key, value = draw_pair(kind, rng)
        if all(key != k and value != v for k, v in pairs):
            pairs.append((key, value))
    if len(pairs) == records:  # the last draw completed it
        return pairs
    raise DataError(f"could not draw {records} distinct {kind} statements (drew {len(pairs)})")


__all__ = [
    "BUILDINGS",
    "CAPACITY",
    "CODE_LETTERS",
    "COMMODITIES",
    "FIRST_NAMES",
    "KEY_LETTERS",
    "KINDS",
    "MIN_STATEMENT_TOKENS",
    "QUALIFIERS",
    "SURNAMES",
    "TOWNS",
    "check_records",
    "distinct_pairs",
    "draw_pair",
    "kinds_used",
]
