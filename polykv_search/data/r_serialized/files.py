"""R data files: ``.rds`` files (compressed streams) and lazy-load databases (``.rdx`` + ``.rdb``)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from pathlib import Path

from polykv_search.data.r_serialized.objects import RDataError, RObject
from polykv_search.data.r_serialized.stream import unserialize


def _decompress(data: bytes, what: str) -> bytes:
    """Undo the whole-file compression ``saveRDS`` applies (gzip, bzip2, xz or none)."""
    try:
        if data[:2] == b"\x1f\x8b":
            return gzip.decompress(data)
        if data[:3] == b"BZh":
            return bz2.decompress(data)
        if data[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(data)
    except (OSError, EOFError, lzma.LZMAError, ValueError) as exc:
        raise RDataError(f"{what}: corrupt compressed R data ({exc})") from None
    return data


def read_rds(path: str | Path) -> RObject:
    """Read an ``.rds`` file (as written by ``saveRDS``, any of R's compressions).

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    RObject
        The stored object.
    """
    path = Path(path)
    return unserialize(_decompress(path.read_bytes(), str(path)), what=str(path))


def read_lazyload_record(rdb: bytes, offset: int, length: int, compressed: int, *, what: str = "rdb") -> RObject:
    """Decode one record of a lazy-load database (``R_lazyLoadDBfetch``).

    Parameters
    ----------
    rdb : bytes
        The whole ``.rdb`` file.
    offset, length : int
        Where the record lies, from the ``.rdx`` index.
    compressed : int
        The index's ``compressed`` entry: 0 none, 1 zlib, 2 or 3 a per-record type byte
        (``Z`` zlib, ``2`` bzip2, ``X`` xz, ``0`` none).

    Returns
    -------
    RObject
        The stored object.
    """
    blob = rdb[offset : offset + length]
    if len(blob) != length:
        raise RDataError(f"{what}: record at {offset} (+{length}) runs past the end of the file")
    try:
        if compressed == 0:
            data = blob
        else:
            (size,) = struct.unpack(">I", blob[:4])
            if compressed == 1:
                data = zlib.decompress(blob[4:])
            else:
                kind, payload = blob[4:5], blob[5:]
                if kind == b"Z":
                    data = zlib.decompress(payload)
                elif kind == b"2":
                    data = bz2.decompress(payload)
                elif kind == b"X":
                    data = lzma.decompress(payload, format=lzma.FORMAT_XZ)
                elif kind == b"0":
                    data = payload
                else:
                    raise RDataError(f"{what}: unknown record compression {kind!r}")
            if len(data) != size:
                raise RDataError(f"{what}: record at {offset} inflates to {len(data)} bytes, not {size}")
    except (zlib.error, OSError, EOFError, lzma.LZMAError, struct.error) as exc:
        raise RDataError(f"{what}: corrupt record at {offset} ({exc})") from None
    return unserialize(data, what=what)


def read_lazyload_db(stem: str | Path, names: list[str] | None = None) -> dict[str, RObject]:
    """Read the variables of a lazy-load database (``STEM.rdx`` + ``STEM.rdb``).

    Parameters
    ----------
    stem : str or Path
        The path without extension, e.g. ``.../janeaustenr/data/Rdata``.
    names : list of str, optional
        Variables to read (all when omitted); a missing name raises ``RDataError``.

    Returns
    -------
    dict[str, RObject]
        Variable name to value, in index order.
    """
    stem = Path(stem)
    rdx_path, rdb_path = stem.with_suffix(".rdx"), stem.with_suffix(".rdb")
    for p in (rdx_path, rdb_path):
        if not p.is_file():
            raise RDataError(f"no lazy-load database file {p}")
    index = read_rds(rdx_path)
    if index.type != "list" or not index.names or "variables" not in index.names:
        raise RDataError(f"{rdx_path}: not a lazy-load index")
    entries = dict(zip(index.names, index.value))
    variables = entries["variables"]
    compressed_obj = entries.get("compressed")
    compressed = 1
    if compressed_obj is not None and compressed_obj.value:
        c = compressed_obj.value[0]
        compressed = int(c) if c is not None else 1
    where = dict(zip(variables.names or [], variables.value))
    wanted = list(where) if names is None else names
    missing = [n for n in wanted if n not in where]
    if missing:
        raise RDataError(f"{rdx_path}: no variable(s) {', '.join(missing)} (has {', '.join(where)})")
    rdb = rdb_path.read_bytes()
    out = {}
    for name in wanted:
        offset, length = (int(v) for v in where[name].value[:2])
        out[name] = read_lazyload_record(rdb, offset, length, compressed, what=f"{rdb_path}:{name}")
    return out
