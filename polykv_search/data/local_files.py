"""Users' own text: a ``.txt`` file or a directory of them, ``.jsonl`` or ``.parquet``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .corpus import Corpus, Document
from .errors import DataError

SUFFIXES = (".txt", ".jsonl", ".parquet")


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read: {err.strerror or err}") from None


def _document(row: dict[str, Any], default_id: str, where: str) -> Document | None:
    text = row.get("text")
    if not isinstance(text, str):
        raise DataError(f"{where}: no string field 'text'")
    if not text.strip():
        return None
    doc_id = row.get("id")
    doc_id = default_id if doc_id is None else str(doc_id)
    title = row.get("title")
    return Document(id=doc_id, title=doc_id if title is None else str(title), text=text)


def _txt_documents(path: Path) -> list[Document]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"{path}: directory holds no .txt files")
        ids = [p.relative_to(path).with_suffix("").as_posix() for p in files]
    else:
        files, ids = [path], [path.stem]
    docs = [Document(id=i, title=i, text=_read_text(p)) for i, p in zip(ids, files)]
    return [d for d in docs if d.text.strip()]


def _jsonl_documents(path: Path) -> list[Document]:
    docs = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: a JSON object per line is expected")
        doc = _document(row, f"{path.stem}-{lineno}", f"{path}:{lineno}")
        if doc is not None:
            docs.append(doc)
    return docs


def _parquet_documents(path: Path) -> list[Document]:
    import pyarrow.parquet as pq  # installed with `datasets`

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: unreadable parquet ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    if "text" not in table.column_names:
        raise DataError(f"{path}: no column 'text' (has {', '.join(table.column_names)})")
    keep = [c for c in ("id", "title", "text") if c in table.column_names]
    docs = []
    for i, row in enumerate(table.select(keep).to_pylist()):
        doc = _document(row, f"{path.stem}-{i}", f"{path} row {i}")
        if doc is not None:
            docs.append(doc)
    return docs


def load_local(path: str | Path, *, spec: str | None = None) -> Corpus:
    """A corpus from a local file or directory.

    Parameters
    ----------
    path : str or Path
        A ``.txt`` file (one document, id = file stem), a directory of ``.txt`` files (one
        document each, id = relative path without suffix), a ``.jsonl`` file (field ``text``,
        optional ``id``/``title``; default id ``STEM-LINENO``) or a ``.parquet`` file (column
        ``text``, optional ``id``/``title``).
    spec : str, optional
        The spec string, recorded in the corpus.

    Returns
    -------
    Corpus
        Named after the file or directory; empty documents are dropped.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise DataError(f"no such corpus file or directory: {path}")
    suffix = path.suffix.lower()
    if path.is_dir() or suffix == ".txt":
        docs = _txt_documents(path)
    elif suffix == ".jsonl":
        docs = _jsonl_documents(path)
    elif suffix == ".parquet":
        docs = _parquet_documents(path)
    else:
        raise DataError(f"{path}: unsupported corpus file type {suffix or '(none)'} (use .txt, .jsonl, .parquet)")
    return Corpus(
        name=path.name,
        documents=docs,
        spec=spec or str(path),
        note=f"local {'directory' if path.is_dir() else suffix[1:]} {path.resolve()}",
    )
