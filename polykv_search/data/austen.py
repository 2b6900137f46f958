"""The ``austen`` corpus: Jane Austen's six novels from Debian's ``r-cran-janeaustenr`` package.

The package stores each novel as an R character vector (one element per line of the Project
Gutenberg text) in the lazy-load database ``data/Rdata.{rdx,rdb}``; it is read with the pure-Python
reader in :mod:`polykv_search.data.r_serialized`, so R is not needed. The texts are cached as plain
``.txt`` files so later loads need neither apt nor the reader.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..io import atomic_write_text
from ..paths import cache_dir
from .corpus import Corpus, Document
from .debian_packages import extracted_package
from .errors import DataError
from .r_serialized import read_lazyload_db

PACKAGE = "r-cran-janeaustenr"
#: (R object name, title) in publication order; the title is the document id.
NOVELS: tuple[tuple[str, str], ...] = (
    ("sensesensibility", "Sense & Sensibility"),
    ("prideprejudice", "Pride & Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
)
#: The fixed calibration/evaluation split of the six novels (document ids).
CALIB_TITLES: tuple[str, ...] = ("Sense & Sensibility", "Pride & Prejudice", "Mansfield Park")
EVAL_TITLES: tuple[str, ...] = ("Emma", "Northanger Abbey", "Persuasion")
#: R libraries checked before downloading (a system with the package installed needs no apt).
R_LIBRARIES = ("/usr/lib/R/site-library", "/usr/local/lib/R/site-library", "/usr/lib/R/library")
_CACHE = "austen-v1"
_TITLE_OF = dict(NOVELS)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower()).replace("and", "")


_BY_KEY = {_key(k): k for k, _ in NOVELS} | {_key(t): k for k, t in NOVELS}


def parse_selection(selection: str | None) -> list[str]:
    """R object names for ``"Emma,Persuasion"`` (titles or R names, any case); all when empty."""
    if not selection or not selection.strip():
        return [k for k, _ in NOVELS]
    wanted = set()
    for part in selection.split(","):
        if not part.strip():
            continue
        rname = _BY_KEY.get(_key(part))
        if rname is None:
            titles = ", ".join(t for _, t in NOVELS)
            raise DataError(f"austen: unknown novel {part.strip()!r} (choose from {titles})")
        wanted.add(rname)
    return [k for k, _ in NOVELS if k in wanted]


def novels_from_r_package(package_dir: str | Path) -> dict[str, str]:
    """Read the six novels from an unpacked/installed ``janeaustenr`` R package directory.

    Parameters
    ----------
    package_dir : str or Path
        The directory holding ``data/Rdata.rdx`` and ``data/Rdata.rdb``.

    Returns
    -------
    dict[str, str]
        R object name to text (the vector's lines joined with ``\\n``).
    """
    objects = read_lazyload_db(Path(package_dir) / "data" / "Rdata", [k for k, _ in NOVELS])
    texts = {}
    for name, obj in objects.items():
        if obj.type != "character":
            raise DataError(f"janeaustenr: {name} is a {obj.type} vector, not character")
        texts[name] = "\n".join(line or "" for line in obj.value).strip() + "\n"
    return texts


def _cache_paths() -> tuple[Path, Path]:
    root = cache_dir("corpora", _CACHE)
    return root, root / "manifest.json"


def _read_cache() -> tuple[dict[str, str], str] | None:
    root, manifest_path = _cache_paths()
    try:
        manifest = json.loads(manifest_path.read_text("utf-8"))
        texts = {}
        for name, digest in manifest["sha256"].items():
            text = (root / f"{name}.txt").read_text("utf-8")
            if hashlib.sha256(text.encode("utf-8")).hexdigest() != digest:
                return None
            texts[name] = text
        if set(texts) != set(_TITLE_OF):
            return None
        return texts, manifest["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(texts: dict[str, str], source: str) -> None:
    root, manifest_path = _cache_paths()
    for name, text in texts.items():
        atomic_write_text(root / f"{name}.txt", text)
    digests = {n: hashlib.sha256(t.encode("utf-8")).hexdigest() for n, t in texts.items()}
    atomic_write_text(manifest_path, json.dumps({"source": source, "sha256": digests}, indent=2) + "\n")


def _fetch() -> tuple[dict[str, str], str]:
    for lib in R_LIBRARIES:
        pkg = Path(lib) / "janeaustenr"
        if (pkg / "data" / "Rdata.rdx").is_file():
            return novels_from_r_package(pkg), f"installed R package {pkg}"
    with extracted_package(PACKAGE) as (root, deb):
        pkgs = sorted(root.glob("usr/lib/R/*/janeaustenr"))
        if not pkgs:
            raise DataError(f"{deb}: no janeaustenr R package inside")
        return novels_from_r_package(pkgs[0]), f"Debian {deb}"


def load_austen(selection: str | None = None, *, spec: str = "austen") -> Corpus:
    """The ``austen`` corpus: one document per novel, the title as id.

    Parameters
    ----------
    selection : str, optional
        Comma-separated novels (``"Emma,Persuasion"``); all six when omitted.
    spec : str
        The spec string, recorded in the corpus.

    Returns
    -------
    Corpus
        Named ``austen``.

    Raises
    ------
    AptUnavailable
        When nothing is cached and apt cannot fetch the package (the caller may fall back).
    DataError
        For an unknown novel or unreadable package data.
    """
    names = parse_selection(selection)
    cached = _read_cache()
    if cached is None:
        texts, source = _fetch()
        _write_cache(texts, source)
        where = f"{source}, read from R lazy-load data in Python; cached in {_cache_paths()[0]}"
    else:
        texts, source = cached
        where = f"{source} (via the cache in {_cache_paths()[0]})"
    documents = [Document(id=_TITLE_OF[n], title=_TITLE_OF[n], text=texts[n]) for n in names]
    return Corpus(
        name="austen", documents=documents, spec=spec, note=f"Jane Austen's novels ({len(documents)} of 6) from {where}"
    )
