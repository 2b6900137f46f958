"""The corpus types every provider returns: documents with ids, a content fingerprint and a note."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .errors import DataError


@dataclass(frozen=True)
class Document:
    """One document of a corpus.

    Attributes
    ----------
    id : str
        Unique within its corpus; the calibration/evaluation split is keyed on it.
    title : str
        Human-readable title.
    text : str
        The full text.
    """

    id: str
    title: str
    text: str


def fingerprint_documents(documents: list[Document]) -> str:
    """A short (16 hex digits) sha256 of the documents' ids, titles and texts, in order."""
    h = hashlib.sha256()
    for doc in documents:
        for part in (doc.id, doc.title, doc.text):
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()[:16]


@dataclass
class Corpus:
    """A named list of documents, as returned by :func:`polykv_search.data.load_corpus`.

    Attributes
    ----------
    name : str
        The provider's name (``austen``, ``debian-faq``, ``pydoc``, a file name, ``hf:...``);
        after a fallback, the name of what was actually loaded.
    documents : list[Document]
        At least one, with unique ids.
    fingerprint : str
        Short sha256 of the content, filled in when left empty.
    note : str
        Where the text came from, and any fallback taken.
    spec : str
        The spec string that was asked for.
    """

    name: str
    documents: list[Document]
    fingerprint: str = ""
    note: str = ""
    spec: str = ""
    _by_id: dict[str, Document] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.documents:
            raise DataError(f"corpus {self.spec or self.name!r} has no non-empty documents")
        ids = [d.id for d in self.documents]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:3]
            raise DataError(f"corpus {self.spec or self.name!r} has duplicate document ids: {dup}")
        if not self.fingerprint:
            self.fingerprint = fingerprint_documents(self.documents)
        self._by_id = {d.id: d for d in self.documents}

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, doc_id: str) -> Document:
        return self._by_id[doc_id]

    @property
    def n_chars(self) -> int:
        """Total characters over all documents."""
        return sum(len(d.text) for d in self.documents)

    def describe(self) -> dict[str, object]:
        """A JSON-ready provenance record (no texts)."""
        return {
            "name": self.name,
            "spec": self.spec,
            "fingerprint": self.fingerprint,
            "n_documents": len(self.documents),
            "n_chars": self.n_chars,
            "note": self.note,
        }
