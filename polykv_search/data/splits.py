"""Deterministic calibration/evaluation splits: the two roles never share a document."""

from __future__ import annotations

import hashlib

from .austen import CALIB_TITLES, EVAL_TITLES
from .corpus import Corpus, Document
from .errors import DataError

ROLES = ("calib", "eval")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise DataError(f"unknown split role {role!r} (use 'calib' or 'eval')")


def _unit_hash(doc_id: str) -> float:
    digest = hashlib.sha256(f"polykv-split:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _halves(doc: Document) -> tuple[Document, Document]:
    text = doc.text
    mid = len(text) // 2
    cut = mid
    for sep in ("\n\n", "\n", " "):
        before, after = text.rfind(sep, 0, mid), text.find(sep, mid)
        candidates = [i + len(sep) for i in (before, after) if i > 0 and 0 < i + len(sep) < len(text)]
        if candidates:
            cut = min(candidates, key=lambda i: abs(i - mid))
            break
    first = Document(id=f"{doc.id}#1of2", title=f"{doc.title} (first half)", text=text[:cut])
    second = Document(id=f"{doc.id}#2of2", title=f"{doc.title} (second half)", text=text[cut:])
    return first, second


def _split(corpus: Corpus) -> tuple[list[Document], list[Document], str]:
    docs = corpus.documents
    if len(docs) == 1:
        first, second = _halves(docs[0])
        return [first], [second], "halves: a single document, calib = its first half, eval = its second half"
    if corpus.name == "austen":
        calib = [d for d in docs if d.id in CALIB_TITLES]
        evaluation = [d for d in docs if d.id in EVAL_TITLES]
        if calib and evaluation:
            return calib, evaluation, "austen: calib = the first three novels, eval = the last three"
    hashes = {d.id: _unit_hash(d.id) for d in docs}
    calib = [d for d in docs if hashes[d.id] < 0.5]
    evaluation = [d for d in docs if hashes[d.id] >= 0.5]
    if not calib:
        moved = min(evaluation, key=lambda d: hashes[d.id])
        calib, evaluation = [moved], [d for d in evaluation if d is not moved]
    elif not evaluation:
        moved = max(calib, key=lambda d: hashes[d.id])
        calib, evaluation = [d for d in calib if d is not moved], [moved]
    return calib, evaluation, "hash: sha256 of each document id, calib below one half, eval above"


def split_corpus(corpus: Corpus, role: str) -> list[Document]:
    """The documents of ``corpus`` used for ``role`` (``"calib"`` or ``"eval"``).

    Deterministic and disjoint: for ``austen``, calib = Sense & Sensibility, Pride & Prejudice,
    Mansfield Park and eval = Emma, Northanger Abbey, Persuasion; otherwise each document goes by
    a hash of its id (about half each, at least one each); a single document is cut into halves
    (ids ``ID#1of2`` for calib, ``ID#2of2`` for eval).

    Parameters
    ----------
    corpus : Corpus
    role : {"calib", "eval"}

    Returns
    -------
    list[Document]
        In corpus order.
    """
    _check_role(role)
    calib, evaluation, _ = _split(corpus)
    return calib if role == "calib" else evaluation


def describe_split(corpus: Corpus, role: str) -> dict[str, object]:
    """A JSON-ready record of the split, to store beside anything computed from it.

    Returns
    -------
    dict
        ``corpus`` (its :meth:`Corpus.describe`), ``role``, ``method``, ``documents`` (the ids
        used for ``role``), and the ids of both sides under ``calib`` and ``eval``.
    """
    _check_role(role)
    calib, evaluation, method = _split(corpus)
    return {
        "corpus": corpus.describe(),
        "role": role,
        "method": method,
        "documents": [d.id for d in (calib if role == "calib" else evaluation)],
        "calib": [d.id for d in calib],
        "eval": [d.id for d in evaluation],
    }
