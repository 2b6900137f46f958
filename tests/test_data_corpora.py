"""Corpus providers behind `load_corpus(spec)`, each on tiny local fixtures (no network, no apt)."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest

from polykv_search.data import DataError, austen, debian_faq, load_corpus
from polykv_search.data.debian_faq import split_chapters


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYKV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(austen, "R_LIBRARIES", ())
    monkeypatch.setattr(debian_faq, "INSTALLED_TEXT", tmp_path / "not-installed.txt.gz")


# -- local files --------------------------------------------------------------------------------
def test_txt_file_is_one_document(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("Some prose.\n", "utf-8")
    corpus = load_corpus(str(path))
    assert [(d.id, d.text) for d in corpus.documents] == [("notes", "Some prose.\n")]
    assert corpus.name == "notes.txt" and corpus.spec == str(path) and "local txt" in corpus.note
    assert len(corpus.fingerprint) == 16


def test_directory_of_txt_files(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("bee", "utf-8")
    (tmp_path / "d" / "sub" / "a.txt").write_text("ay", "utf-8")
    (tmp_path / "d" / "empty.txt").write_text("  \n", "utf-8")
    (tmp_path / "d" / "skip.md").write_text("not text corpus", "utf-8")
    corpus = load_corpus(str(tmp_path / "d"))
    assert [(d.id, d.text) for d in corpus.documents] == [("b", "bee"), ("sub/a", "ay")]


def test_jsonl_text_with_optional_id_and_title(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"text": "first", "id": 7, "title": "Seven"}, {"text": "second"}, {"text": ""}]
    path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n", "utf-8")
    docs = load_corpus(str(path)).documents
    assert [(d.id, d.title, d.text) for d in docs] == [("7", "Seven", "first"), ("docs-2", "docs-2", "second")]


def test_jsonl_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{oops\n', "utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:2: invalid JSON"):
        load_corpus(str(bad))
    bad.write_text('{"body": "no text field"}\n', "utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:1: no string field 'text'"):
        load_corpus(str(bad))


def test_parquet_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["alpha", "beta"], "n": [1, 2]}), path)
    assert [(d.id, d.text) for d in load_corpus(str(path)).documents] == [("x", "alpha"), ("y", "beta")]
    pq.write_table(pa.table({"body": ["alpha"]}), path)
    with pytest.raises(DataError, match="no column 'text'"):
        load_corpus(str(path))


# -- hf:NAME[:CONFIG][:SPLIT] through `datasets`, on local directories only ---------------------
@pytest.fixture
def offline_datasets(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return datasets


def test_hf_save_to_disk_dataset(tmp_path, offline_datasets):
    ds = offline_datasets.Dataset.from_dict({"label": [0, 1], "body": ["one doc", "two doc"], "title": ["A", "B"]})
    ds.save_to_disk(str(tmp_path / "ds"))
    corpus = load_corpus(f"hf:{tmp_path / 'ds'}")
    assert [(d.id, d.title, d.text) for d in corpus.documents] == [("0", "A", "one doc"), ("1", "B", "two doc")]
    assert "column 'body'" in corpus.note  # no `text` column: the first string column


def test_hf_dataset_dict_split(tmp_path, offline_datasets):
    dd = offline_datasets.DatasetDict(
        {
            "train": offline_datasets.Dataset.from_dict({"text": ["train doc"]}),
            "test": offline_datasets.Dataset.from_dict({"text": ["test doc", " "]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    assert [d.text for d in load_corpus(f"hf:{tmp_path / 'dd'}").documents] == ["train doc"]
    assert [d.text for d in load_corpus(f"hf:{tmp_path / 'dd'}::test").documents] == ["test doc"]
    with pytest.raises(DataError, match="no split 'dev'"):
        load_corpus(f"hf:{tmp_path / 'dd'}::dev")


def test_hf_local_data_files_directory(tmp_path, offline_datasets):
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "train.jsonl").write_text(
        "\n".join(json.dumps({"id": f"r{i}", "text": f"row {i}"}) for i in range(3)) + "\n", "utf-8"
    )
    corpus = load_corpus(f"hf:{folder}")
    assert [(d.id, d.text) for d in corpus.documents] == [("r0", "row 0"), ("r1", "row 1"), ("r2", "row 2")]
    assert corpus.name == f"hf:{folder}"


def test_hf_load_failures_become_data_errors(monkeypatch, offline_datasets):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub\nsecond line")

    monkeypatch.setattr(offline_datasets, "load_dataset", unreachable)
    expected = r"^hf:some/dataset: could not load \(ConnectionError: Couldn't reach the Hub\)$"
    with pytest.raises(DataError, match=expected):
        load_corpus("hf:some/dataset:cfg:train")
    with pytest.raises(DataError, match="bad hf spec"):
        load_corpus("hf:a:b:c:d")


# -- pydoc, errors ------------------------------------------------------------------------------
def test_pydoc_topics():
    corpus = load_corpus("pydoc")
    ids = [d.id for d in corpus.documents]
    assert corpus.name == "pydoc" and len(ids) > 50 and ids == sorted(ids)
    assert "if" in ids and 'The "if" statement' in corpus["if"].text
    assert load_corpus("pydoc").fingerprint == corpus.fingerprint


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nonsense", "unknown corpus spec 'nonsense'"),
        ("", "empty corpus spec"),
        ("missing.txt", "no such corpus file or directory"),
        ("some/dir", "no such corpus file or directory"),
        ("pydoc:extra", "unknown corpus spec"),
    ],
)
def test_bad_specs_are_one_line_data_errors(spec, message):
    with pytest.raises(DataError, match=message) as err:
        load_corpus(spec)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


def test_unsupported_suffix_and_empty_file(tmp_path):
    (tmp_path / "a.csv").write_text("text\nx\n", "utf-8")
    with pytest.raises(DataError, match="unsupported corpus file type .csv"):
        load_corpus(str(tmp_path / "a.csv"))
    (tmp_path / "e.jsonl").write_text("\n", "utf-8")
    with pytest.raises(DataError, match="no non-empty documents"):
        load_corpus(str(tmp_path / "e.jsonl"))


def test_duplicate_ids_are_rejected(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', "utf-8")
    with pytest.raises(DataError, match="duplicate document ids"):
        load_corpus(str(tmp_path / "d.jsonl"))


# -- debian-faq and the apt fallback -----------------------------------------------------------
FAQ = (
    "The Debian GNU/Linux FAQ\n\nTable of Contents\n\n1. One\n2. Two\n\n"
    "Chapter\u00a01.\u00a0One\n\n1.1. Why?\n\n    Because.\n\n"
    "Chapter\u00a02.\u00a0Two\n\n2.1. How?\n\n    Like this.\n"
)


def test_faq_chapters():
    docs = split_chapters(FAQ)
    assert [(d.id, d.title) for d in docs] == [("ch01", "1. One"), ("ch02", "2. Two")]
    assert docs[0].text == "Chapter 1. One\n\n1.1. Why?\n\nBecause.\n"


def test_faq_from_installed_file_then_cache(tmp_path, monkeypatch):
    import gzip

    installed = tmp_path / "faq.txt.gz"
    installed.write_bytes(gzip.compress(FAQ.encode("utf-8")))
    monkeypatch.setattr(debian_faq, "INSTALLED_TEXT", installed)
    first = load_corpus("debian-faq")
    installed.unlink()
    second = load_corpus("debian-faq")
    assert [d.id for d in second.documents] == ["ch01", "ch02"]
    assert second.fingerprint == first.fingerprint and "cache" in second.note


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script, "utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("spec", ["austen", "austen:Emma", "debian-faq"])
def test_failing_apt_falls_back_to_pydoc_with_a_warning(tmp_path, monkeypatch, spec):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir, "apt-get", 'echo "E: Unable to locate package $2" >&2; exit 100\n')
    fake_tool(bin_dir, "dpkg-deb", "exit 0\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.warns(RuntimeWarning, match="falling back to 'pydoc'"):
        corpus = load_corpus(spec)
    assert corpus.name == "pydoc" and corpus.spec == spec
    assert corpus.note.startswith("FALLBACK") and "Unable to locate package" in corpus.note
    assert "apt-get update" in corpus.note


def test_missing_apt_falls_back_to_pydoc(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.warns(RuntimeWarning, match="apt-get and dpkg-deb not found"):
        corpus = load_corpus("austen")
    assert corpus.name == "pydoc"


def test_cached_austen_needs_no_apt(tmp_path, monkeypatch):
    austen._write_cache({rname: f"{title} text\n" for rname, title in austen.NOVELS}, "test")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        corpus = load_corpus("austen")
    assert corpus.name == "austen" and corpus["Persuasion"].text == "Persuasion text\n"


# -- the real apt path (network to the Debian mirror; once, not in the default run) ------------
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("POLYKV_NO_APT") == "1", reason="POLYKV_NO_APT=1")
def test_real_apt_corpora():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        novels = load_corpus("austen")
        faq = load_corpus("debian-faq")
    assert [d.id for d in novels.documents] == [t for _, t in austen.NOVELS]
    assert novels["Pride & Prejudice"].text.count("It is a truth universally acknowledged") == 1
    assert 3_900_000 < novels.n_chars < 4_200_000
    assert len(faq.documents) >= 10 and faq.documents[0].title.startswith("1. ")
