"""``load_corpus(spec)``: every corpus provider behind one spec string."""

from __future__ import annotations

import warnings
from pathlib import Path

from .austen import load_austen
from .corpus import Corpus
from .debian_faq import load_debian_faq
from .debian_packages import AptUnavailable
from .errors import DataError
from .hf_datasets import load_hf
from .local_files import SUFFIXES, load_local
from .pydoc_topics import load_pydoc

#: Named corpora (``austen`` also takes ``austen:Title,Title``).
NAMED_CORPORA = ("austen", "debian-faq", "pydoc")
DEFAULT_CORPUS = "austen"


def _fallback(spec: str, exc: AptUnavailable) -> Corpus:
    message = f"corpus {spec!r} needs apt, which is unavailable ({exc}); falling back to 'pydoc'"
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return load_pydoc(spec=spec, note=f"FALLBACK: {message}. Loaded ")


def load_corpus(spec: str) -> Corpus:
    """Load a corpus from a spec string.

    Parameters
    ----------
    spec : str
        One of:

        - ``austen`` or ``austen:Emma,Persuasion``: Jane Austen's novels (Debian
          ``r-cran-janeaustenr``, fetched with apt once, then cached), one document per novel;
        - ``debian-faq``: the Debian FAQ (Debian ``debian-faq``), one document per chapter;
        - ``pydoc``: CPython's ``pydoc_data.topics``, one document per topic;
        - a local path: ``.txt`` file or directory of them, ``.jsonl`` (field ``text``), ``.parquet``
          (column ``text``);
        - ``hf:NAME[:CONFIG][:SPLIT]``: a ``datasets`` dataset (hub id or local directory).

        When apt is missing or fails, ``austen`` and ``debian-faq`` fall back to ``pydoc`` with a
        ``RuntimeWarning``, and the corpus note says so.

    Returns
    -------
    Corpus

    Raises
    ------
    DataError
        For an unknown spec, a missing file or unusable content (one-line message).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise DataError("empty corpus spec (use austen, debian-faq, pydoc, a path or hf:NAME)")
    spec = spec.strip()
    head, _, rest = spec.partition(":")
    kind = head.lower()
    if kind == "austen":
        try:
            return load_austen(rest, spec=spec)
        except AptUnavailable as exc:
            return _fallback(spec, exc)
    if kind == "debian-faq" and not rest:
        try:
            return load_debian_faq(spec=spec)
        except AptUnavailable as exc:
            return _fallback(spec, exc)
    if kind == "pydoc" and not rest:
        return load_pydoc(spec=spec)
    if kind == "hf" and rest:
        return load_hf(rest, spec=spec)
    path = Path(spec).expanduser()
    if path.exists() or path.suffix.lower() in SUFFIXES or "/" in spec or "\\" in spec:
        return load_local(path, spec=spec)
    raise DataError(
        f"unknown corpus spec {spec!r} (use {', '.join(NAMED_CORPORA)}, a .txt/.jsonl/.parquet path or hf:NAME)"
    )
