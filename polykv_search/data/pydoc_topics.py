"""The ``pydoc`` corpus: CPython's help topics (``pydoc_data.topics``), present in every install."""

from __future__ import annotations

import sys

from .corpus import Corpus, Document


def load_pydoc(*, spec: str = "pydoc", note: str = "") -> Corpus:
    """One document per ``pydoc_data.topics`` topic, sorted by topic name (the id and title).

    Parameters
    ----------
    spec : str
        The spec string, recorded in the corpus.
    note : str
        Prepended to the corpus note (used to record a fallback).

    Returns
    -------
    Corpus
        Named ``pydoc``; its content (and fingerprint) depends on the Python version.
    """
    from pydoc_data.topics import topics

    docs = [Document(id=k, title=k, text=v) for k, v in sorted(topics.items()) if v.strip()]
    source = f"CPython {sys.version.split()[0]} pydoc_data.topics ({len(docs)} topics)"
    return Corpus(name="pydoc", documents=docs, spec=spec, note=f"{note}{source}")
