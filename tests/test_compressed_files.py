"""Results files, signal tables and strategies are read alike from ``.json``, ``.json.xz`` and ``.json.gz``
(``studies/`` keeps its large JSON files xz-compressed); a damaged compressed file is one line, exit code 2."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pytest

from polykv_search import compare as cmp
from polykv_search.cli import main
from polykv_search.io import read_text
from signals import SignalTable
from signals.synthetic import random_signal_table
from strategies import Strategy, StrategyError

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "fixtures" / "results_v2.json"
COMPRESS = {".xz": lzma.compress, ".gz": gzip.compress}


def compressed(tmp_path: Path, source: Path | str, suffix: str, name: str = "doc.json") -> Path:
    data = source.read_bytes() if isinstance(source, Path) else source.encode()
    out = tmp_path / (name + suffix)
    out.write_bytes(COMPRESS[suffix](data))
    return out


@pytest.mark.parametrize("suffix", [".xz", ".gz"])
def test_read_text_decompresses_by_suffix_and_reads_plain_files_as_they_are(tmp_path, suffix):
    text = '{"name": "Emma Woodhouse", "é": 1}\n'
    (tmp_path / "plain.json").write_text(text, encoding="utf-8")
    assert read_text(tmp_path / "plain.json") == text
    assert read_text(compressed(tmp_path, text, suffix)) == text


@pytest.mark.parametrize("suffix", [".xz", ".gz"])
def test_each_loader_reads_the_compressed_form_as_the_plain_one(tmp_path, suffix):
    assert cmp.load_results(compressed(tmp_path, RESULTS, suffix)) == cmp.load_results(RESULTS)
    table = random_signal_table(num_layers=3, patterns=("snapkv", "tova"), budgets=(8, 16), seed=0)
    (tmp_path / "t.json").write_text(json.dumps(table.to_json()))
    loaded = SignalTable.load(compressed(tmp_path, tmp_path / "t.json", suffix, "t.json"))
    assert loaded.to_json() == SignalTable.load(tmp_path / "t.json").to_json()
    assert main(["show", str(tmp_path / f"t.json{suffix}")]) == 0  # the CLI's own reader decompresses too
    strategy = Strategy.uniform(3, "snapkv", 16)
    strategy.save(tmp_path / "s.json")
    assert Strategy.load(compressed(tmp_path, tmp_path / "s.json", suffix, "s.json")) == strategy


def test_a_damaged_compressed_file_is_one_line_naming_it(tmp_path, capsys):
    good = compressed(tmp_path, RESULTS, ".xz")
    bad = tmp_path / "cut.json.xz"
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(cmp.CompareError, match=r"cut\.json\.xz.*not a valid xz file"):
        cmp.load_results(bad)
    with pytest.raises(StrategyError, match="not a valid xz file"):
        Strategy.load(bad)
    assert main(["compare", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a valid xz file" in err and len(err.splitlines()) == 1


def test_every_compressed_study_file_decompresses_to_json_and_its_results_files_are_readable():
    files = sorted((ROOT / "studies").rglob("*.json.xz"))
    assert len(files) > 100
    for path in files:
        doc = json.loads(read_text(path))
        if isinstance(doc, dict) and doc.get("schema") == "polykv-results":
            cmp.check_results(doc, str(path))
