"""``hf:NAME[:CONFIG][:SPLIT]`` corpora through the ``datasets`` library.

``NAME`` is a hub id (needs hub access or a warm ``datasets`` cache), a local directory of data
files (``load_dataset`` infers the builder), or a directory written by ``Dataset.save_to_disk`` /
``DatasetDict.save_to_disk`` (read with ``load_from_disk``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .corpus import Corpus, Document
from .errors import DataError

_STRING_DTYPES = ("string", "large_string")


def parse_hf_spec(rest: str) -> tuple[str, str | None, str | None]:
    """``"NAME[:CONFIG][:SPLIT]"`` (the part after ``hf:``) to ``(name, config, split)``."""
    parts = rest.split(":")
    if not parts[0] or len(parts) > 3:
        raise DataError(f"bad hf spec 'hf:{rest}' (expected hf:NAME[:CONFIG][:SPLIT])")
    parts += [""] * (3 - len(parts))
    return parts[0], parts[1] or None, parts[2] or None


def _is_saved_to_disk(path: Path) -> bool:
    return path.is_dir() and (
        (path / "dataset_dict.json").is_file()
        or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file())
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _open(name: str, config: str | None, split: str | None) -> tuple[Any, str]:
    import datasets

    local = Path(name).expanduser()
    try:
        if _is_saved_to_disk(local):
            ds, how = datasets.load_from_disk(str(local)), f"load_from_disk({local})"
        else:
            ds = datasets.load_dataset(name, config, split=split)
            how = f"load_dataset({name!r}, {config!r}, split={split!r})"
    except Exception as exc:  # datasets raises many types (hub, connection, builder errors)
        raise DataError(f"hf:{name}: could not load ({_one_line(exc)})") from None
    if isinstance(ds, (datasets.DatasetDict, dict)):
        if split is None:
            split = "train" if "train" in ds else next(iter(ds), None)
        if split not in ds:
            raise DataError(f"hf:{name}: no split {split!r} (has {', '.join(ds)})")
        ds = ds[split]
        how += f"[{split!r}]"
    return ds, how


def _text_column(ds: Any, name: str) -> str:
    features = ds.features

    def is_string(col: str) -> bool:
        return getattr(features[col], "dtype", None) in _STRING_DTYPES

    if "text" in features and is_string("text"):
        return "text"
    for col in ds.column_names:
        if is_string(col):
            return col
    raise DataError(f"hf:{name}: no string column (columns: {', '.join(ds.column_names)})")


def load_hf(rest: str, *, spec: str | None = None) -> Corpus:
    """A corpus from a ``datasets`` dataset, one document per non-empty row.

    Parameters
    ----------
    rest : str
        ``NAME[:CONFIG][:SPLIT]``; the split defaults to ``train`` (else the first one).
    spec : str, optional
        The spec string, recorded in the corpus.

    Returns
    -------
    Corpus
        Text from column ``text`` (else the first string column); ids from an ``id`` column when
        present and unique, else the row index; titles from a ``title`` column when present.
    """
    name, config, split = parse_hf_spec(rest)
    ds, how = _open(name, config, split)
    text_col = _text_column(ds, name)
    texts = ds[text_col]
    ids = [str(i) for i in range(len(texts))]
    if "id" in ds.column_names:
        given = [str(v) for v in ds["id"]]
        if len(set(given)) == len(given):
            ids = given
    titles = [str(t) for t in ds["title"]] if "title" in ds.column_names else ids
    docs = [Document(id=i, title=t, text=x) for i, t, x in zip(ids, titles, texts) if isinstance(x, str) and x.strip()]
    label = f"hf:{name}" + (f":{config}" if config else "")
    return Corpus(
        name=label,
        documents=docs,
        spec=spec or f"hf:{rest}",
        note=f"datasets {how}, column {text_col!r}, {len(docs)} non-empty rows",
    )
