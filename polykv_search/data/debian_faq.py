"""The ``debian-faq`` corpus: the Debian GNU/Linux FAQ (question/answer prose), one document per chapter.

Read from the plain-text edition (``/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz``) of Debian's
``debian-faq`` package: from the installed file when present, else fetched with apt. The text is
cached as plain text.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

from ..io import atomic_write_text
from ..paths import cache_dir
from .corpus import Corpus, Document
from .debian_packages import extracted_package
from .errors import DataError

PACKAGE = "debian-faq"
TEXT_PATH = "usr/share/doc/debian/FAQ/debian-faq.en.txt.gz"
#: Read directly when the package is installed (no apt needed).
INSTALLED_TEXT = Path("/") / TEXT_PATH
_CACHE = "debian-faq-v1"
_CHAPTER = re.compile(r"^Chapter[ \t]+(\d+)\.[ \t]+(.+)$", re.MULTILINE)


def split_chapters(text: str) -> list[Document]:
    """Cut the FAQ's plain text into one document per ``Chapter N. Title`` heading.

    The front matter (title page, table of contents) is dropped and the 4-space body indent
    removed; no-break spaces become spaces. Text without chapter headings becomes a single
    document.

    Parameters
    ----------
    text : str
        The whole plain-text FAQ.

    Returns
    -------
    list[Document]
        Ids ``ch01``, ``ch02``, ...; titles ``"1. Definitions and overview"``, ...
    """
    text = text.replace("\u00a0", " ")
    heads = list(_CHAPTER.finditer(text))
    if not heads:
        return [Document(id="faq", title="Debian FAQ", text=_dedent(text))]
    docs = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = _dedent(text[m.start() : end])
        number, title = int(m.group(1)), m.group(2).strip()
        docs.append(Document(id=f"ch{number:02d}", title=f"{number}. {title}", text=body))
    return docs


def _dedent(text: str) -> str:
    lines = [line[4:] if line.startswith("    ") else line for line in text.splitlines()]
    return "\n".join(line.rstrip() for line in lines).strip() + "\n"


def _cache_paths() -> tuple[Path, Path]:
    root = cache_dir("corpora", _CACHE)
    return root / "debian-faq.en.txt", root / "manifest.json"


def _read_cache() -> tuple[str, str] | None:
    text_path, manifest_path = _cache_paths()
    try:
        manifest = json.loads(manifest_path.read_text("utf-8"))
        text = text_path.read_text("utf-8")
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != manifest["sha256"]:
            return None
        return text, manifest["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fetch() -> tuple[str, str]:
    if INSTALLED_TEXT.is_file():
        return gzip.decompress(INSTALLED_TEXT.read_bytes()).decode("utf-8"), f"installed {INSTALLED_TEXT}"
    with extracted_package(PACKAGE) as (root, deb):
        path = root / TEXT_PATH
        if not path.is_file():
            raise DataError(f"{deb}: no {TEXT_PATH} inside")
        return gzip.decompress(path.read_bytes()).decode("utf-8"), f"Debian {deb}"


def load_debian_faq(*, spec: str = "debian-faq") -> Corpus:
    """The ``debian-faq`` corpus, one document per chapter.

    Raises
    ------
    AptUnavailable
        When nothing is cached or installed and apt cannot fetch the package.
    """
    cached = _read_cache()
    if cached is None:
        text, source = _fetch()
        text_path, manifest_path = _cache_paths()
        atomic_write_text(text_path, text)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        atomic_write_text(manifest_path, json.dumps({"source": source, "sha256": digest}, indent=2) + "\n")
        where = f"{source}; cached in {text_path.parent}"
    else:
        text, source = cached
        where = f"{source} (via the cache in {_cache_paths()[0].parent})"
    docs = split_chapters(text)
    return Corpus(
        name="debian-faq", documents=docs, spec=spec, note=f"the Debian FAQ, {len(docs)} chapters, from {where}"
    )
