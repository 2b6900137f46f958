"""The pure-Python reader of R serialized data, on files R wrote and on streams built here by hand.

The fixtures in tests/fixtures/data/janeaustenr/ are unmodified files from Debian's
r-cran-janeaustenr package (written by R 4.2.1); the hand-built streams follow R's serialize.c
byte for byte to cover cases those files lack (NA values, encodings, ALTREP, compressions).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from contextlib import contextmanager
from pathlib import Path

import pytest

from polykv_search.data import DataError, RDataError, austen, load_corpus, read_lazyload_db, read_rds, unserialize
from polykv_search.data.r_serialized import read_lazyload_record

FIXTURES = Path(__file__).parent / "fixtures" / "data" / "janeaustenr"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(austen, "R_LIBRARIES", ())


# -- a minimal XDR writer (the inverse of the reader, after R's serialize.c) ------------------
UTF8, LATIN1, ASCII = 1 << 3, 1 << 2, 1 << 6
NIL = struct.pack(">i", 254)


def i32(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def flags(sxp: int, *, attr: bool = False, tag: bool = False, levels: int = 0) -> bytes:
    return i32(sxp | (attr << 9) | (tag << 10) | (levels << 12))


def charsxp(s: str | None, *, levels: int = UTF8, encoding: str = "utf-8") -> bytes:
    if s is None:
        return flags(9) + i32(-1)
    raw = s.encode(encoding)
    return flags(9, levels=levels) + i32(len(raw)) + raw


def symbol(name: str) -> bytes:
    return flags(1) + charsxp(name, levels=ASCII)


def pairlist(items: list[tuple[str | None, bytes]], sxp: int = 2) -> bytes:
    nodes = [
        flags(sxp, tag=tag is not None) + (symbol(tag) if tag is not None else b"") + value for tag, value in items
    ]
    return b"".join(nodes) + NIL


def strsxp(values: list[str | None], attrs: list[tuple[str, bytes]] | None = None) -> bytes:
    body = i32(len(values)) + b"".join(charsxp(v) for v in values)
    return flags(16, attr=bool(attrs)) + body + (pairlist(attrs) if attrs else b"")


def intsxp(values: list[int], sxp: int = 13) -> bytes:
    return flags(sxp) + i32(len(values), *values)


def realsxp(values: list[float]) -> bytes:
    return flags(14) + i32(len(values)) + struct.pack(f">{len(values)}d", *values)


def vecsxp(items: list[bytes], names: list[str] | None = None) -> bytes:
    attrs = pairlist([("names", strsxp(names))]) if names else b""
    return flags(19, attr=bool(names)) + i32(len(items)) + b"".join(items) + attrs


def stream(item: bytes, version: int = 3) -> bytes:
    header = b"X\n" + i32(version, 0x040201, 0x030500 if version == 3 else 0x020300)
    if version == 3:
        header += i32(5) + b"UTF-8"
    return header + item


def lazyload_db(stem: Path, objects: dict[str, bytes]) -> None:
    """Write STEM.rdb/STEM.rdx the way makeLazyLoadDB does (zlib records, compressed = TRUE)."""
    rdb, where = b"", {}
    for name, item in objects.items():
        data = stream(item)
        record = struct.pack(">I", len(data)) + zlib.compress(data)
        where[name] = intsxp([len(rdb), len(record)])
        rdb += record
    index = vecsxp(
        [vecsxp(list(where.values()), list(where)), vecsxp([]), intsxp([1], sxp=10)],
        ["variables", "references", "compressed"],
    )
    stem.with_suffix(".rdb").write_bytes(rdb)
    stem.with_suffix(".rdx").write_bytes(gzip.compress(stream(index)))


# -- files written by R -------------------------------------------------------------------------
def test_gzip_rds_of_nested_named_lists():
    meta = read_rds(FIXTURES / "package.rds").to_python()
    assert meta["DESCRIPTION"]["Package"] == "janeaustenr"
    assert meta["DESCRIPTION"]["Version"] == "1.0.0"
    assert meta["DESCRIPTION"]["License"] == "MIT + file LICENSE"


def test_character_matrix_keeps_its_dim_attribute():
    obj = read_rds(FIXTURES / "data.rds")
    assert obj.type == "character"
    nrow, ncol = obj.attributes["dim"].value
    assert len(obj.value) == nrow * ncol and nrow == 6
    assert obj.value[:nrow] == [
        "emma",
        "mansfieldpark",
        "northangerabbey",
        "persuasion",
        "prideprejudice",
        "sensesensibility",
    ]


def test_lazyload_index_of_the_novels():
    index = read_rds(FIXTURES / "Rdata.rdx").to_python()
    assert sorted(index["variables"]) == sorted(rname for rname, _ in austen.NOVELS)
    assert index["variables"]["emma"] == [0, 352043]
    # the records tile the 1,601,335-byte Rdata.rdb of the package exactly
    assert sum(length for _, length in index["variables"].values()) == 1601335
    assert index["compressed"] == [True]


def test_lazyload_db_records_written_by_r():
    db = read_lazyload_db(FIXTURES / "janeaustenr", [".packageName", ".__global__", ".__NAMESPACE__."])
    assert db[".packageName"].value == ["janeaustenr"]
    assert db[".__global__"].value[:3] == ["sensesensibility", "prideprejudice", "mansfieldpark"]
    assert (db[".__NAMESPACE__."].type, db[".__NAMESPACE__."].value) == ("persistent", ["env::1"])


def test_unsupported_content_and_missing_names_are_one_line_errors():
    with pytest.raises(RDataError, match="unsupported R object type bytecode") as err:
        read_lazyload_db(FIXTURES / "janeaustenr", ["austen_books"])
    assert "\n" not in str(err.value)
    with pytest.raises(RDataError, match="no variable"):
        read_lazyload_db(FIXTURES / "janeaustenr", ["nope"])
    with pytest.raises(RDataError, match="no lazy-load database file"):
        read_lazyload_db(FIXTURES / "absent")


# -- streams built by hand ----------------------------------------------------------------------
def test_strings_na_and_encodings():
    item = (
        flags(16)
        + i32(4)
        + charsxp("café")
        + charsxp("naïve", levels=LATIN1, encoding="latin-1")
        + charsxp(None)
        + charsxp("plain", levels=ASCII)
    )
    assert unserialize(stream(item)).value == ["café", "naïve", None, "plain"]


def test_numeric_na_and_version_2_header():
    na_real = struct.pack(">II", 0x7FF00000, 1954)
    item = flags(14) + i32(3) + struct.pack(">d", 1.5) + na_real + struct.pack(">d", float("nan"))
    values = unserialize(stream(item, version=2)).value
    assert values[0] == 1.5 and values[1] is None and values[2] != values[2]  # NA vs NaN
    assert unserialize(stream(intsxp([3, -(2**31)]))).value == [3, None]
    assert unserialize(stream(intsxp([1, 0, -(2**31)], sxp=10))).value == [True, False, None]


def test_named_list_with_symbol_references():
    # R writes a symbol once, then REFSXP (255) with its 1-based index in the upper flag bits
    inner = flags(13, attr=True) + i32(2, 7, 8) + pairlist([("names", strsxp(["a", "b"]))])
    names_ref = i32((1 << 8) | 255)
    outer = (
        flags(19, attr=True)
        + i32(2)
        + inner
        + strsxp(["x"])
        + flags(2, tag=True)
        + names_ref
        + strsxp(["second", "first"])
        + NIL
    )
    assert unserialize(stream(outer)).to_python() == {"second": {"a": 7, "b": 8}, "first": ["x"]}


def test_altrep_compact_intseq():
    info = pairlist([(None, symbol("compact_intseq")), (None, symbol("base")), (None, intsxp([13]))])
    item = i32(238) + info + realsxp([4.0, 10.0, 1.0]) + NIL
    assert unserialize(stream(item)).value == [10, 11, 12, 13]


def test_long_pairlist_does_not_recurse():
    item = pairlist([(None, intsxp([i])) for i in range(5000)])
    assert len(unserialize(stream(item)).value) == 5000


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress, lambda b: b])
def test_rds_compressions(tmp_path, compress):
    path = tmp_path / "x.rds"
    path.write_bytes(compress(stream(strsxp(["hello"]))))
    assert read_rds(path).value == ["hello"]


@pytest.mark.parametrize("kind", [b"Z", b"2", b"X", b"0"])
def test_lazyload_record_types(kind):
    data = stream(strsxp(["rec"]))
    payload = {b"Z": zlib.compress, b"2": bz2.compress, b"X": lzma.compress, b"0": lambda b: b}[kind](data)
    record = b"junk" + struct.pack(">I", len(data)) + kind + payload
    assert read_lazyload_record(record, 4, len(record) - 4, compressed=2).value == ["rec"]
    assert read_lazyload_record(data, 0, len(data), compressed=0).value == ["rec"]


def test_garbage_is_rejected():
    with pytest.raises(RDataError, match="not R serialized data"):
        unserialize(b"PK\x03\x04")
    with pytest.raises(RDataError, match="only XDR"):
        unserialize(b"A\n2\n")
    with pytest.raises(RDataError, match="truncated"):
        unserialize(stream(strsxp(["abc"]))[:-2])
    with pytest.raises(RDataError, match="corrupt record"):
        read_lazyload_record(b"\x00\x00\x00\x10notzlib", 0, 11, compressed=1)


# -- the austen provider on a package tree built here ------------------------------------------
def fake_janeaustenr(root: Path) -> Path:
    pkg = root / "usr" / "lib" / "R" / "site-library" / "janeaustenr"
    (pkg / "data").mkdir(parents=True)
    novels = {
        rname: strsxp([title.upper(), "", f"{title} line one", None, "last line"]) for rname, title in austen.NOVELS
    }
    lazyload_db(pkg / "data" / "Rdata", novels)
    return root


def test_austen_from_the_package_then_from_the_cache(tmp_path, monkeypatch):
    calls = []

    @contextmanager
    def fake_extract(package):
        calls.append(package)
        yield fake_janeaustenr(tmp_path / "tree"), "r-cran-janeaustenr_9.9_all.deb"

    monkeypatch.setattr(austen, "extracted_package", fake_extract)
    corpus = load_corpus("austen")
    assert calls == ["r-cran-janeaustenr"]
    assert [d.id for d in corpus.documents] == [t for _, t in austen.NOVELS]
    assert corpus["Emma"].text == "EMMA\n\nEmma line one\n\nlast line\n"
    assert "r-cran-janeaustenr_9.9_all.deb" in corpus.note

    again = load_corpus("austen:Emma,persuasion")  # the cache: no second download
    assert calls == ["r-cran-janeaustenr"]
    assert [d.id for d in again.documents] == ["Emma", "Persuasion"]
    assert again["Emma"].text == corpus["Emma"].text and "cache" in again.note
    assert [d.id for d in load_corpus("austen:sense and sensibility").documents] == ["Sense & Sensibility"]
    with pytest.raises(DataError, match="unknown novel 'Ulysses'"):
        load_corpus("austen:Ulysses")
