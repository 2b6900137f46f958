"""compare on task shards: results files that split a suite's tasks between them (``score --suite
ruler/cwe``, ``--suite ruler/vt``, ...; disjointly, or overlapping on the same samples) give the
comparison of one file."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from polykv_search import compare as cmp
from polykv_search.cli import main

V2 = Path(__file__).parent / "fixtures" / "results_v2.json"
SHARDS = (("broad/continuation", "ruler/niah_single"), ("broad/manyshot", "ruler/vt"))


def shard(doc: dict, tasks: tuple[str, ...], kv_scale: float = 1.0) -> dict:
    """``doc`` as a score run of ``tasks`` only would write it (partial suite means included)."""
    out = copy.deepcopy(doc)
    out["provenance"]["tasks"] = {t: v for t, v in out["provenance"]["tasks"].items() if t in tasks}
    for e in out["entries"]:
        e["tasks"] = {t: v for t, v in e["tasks"].items() if t in tasks}
        e["scores"] = {t: v for t, v in e["scores"].items() if t in tasks}
        e["extra"] = {t: v for t, v in e["extra"].items() if t in tasks}
        suites: dict[str, list[float]] = {}
        for t, v in e["scores"].items():
            suites.setdefault(t.split("/")[0], []).append(v)
        e["suites"] = {s: sum(v) / len(v) for s, v in suites.items()}
        e["kv_bytes"] *= kv_scale
    return out


@pytest.fixture(scope="module")
def whole():
    return cmp.compare([json.loads(V2.read_text())])


def by_name(c: cmp.Comparison) -> dict[str, cmp.Row]:
    return {r.name: r for r in c.rows}


def test_shards_compare_exactly_as_the_one_file(whole):
    doc = json.loads(V2.read_text())
    c = cmp.compare([shard(doc, SHARDS[0]), shard(doc, SHARDS[1])], sources=["a.json", "b.json"])
    assert not c.warnings and len(c.runs) == 1 and c.runs[0]["sources"] == ["a.json", "b.json"]
    rows, ref = by_name(c), by_name(whole)
    assert rows.keys() == ref.keys()
    for name, r in rows.items():
        w = ref[name]
        assert r.suites == pytest.approx(w.suites)
        assert (r.suite_iv, r.task_iv, r.diff, r.gap_iv, r.kl, r.kl_gap) == (
            w.suite_iv,
            w.task_iv,
            w.diff,
            w.gap_iv,
            w.kl,
            w.kl_gap,
        )
    assert cmp.to_markdown(c) == cmp.to_markdown(whole)


def test_kv_bytes_of_shards_are_the_sample_weighted_mean():
    doc = json.loads(V2.read_text())
    a, b = shard(doc, SHARDS[0]), shard(doc, SHARDS[1], kv_scale=2.0)
    c = cmp.compare([a, b])
    e_a = next(e for e in a["entries"] if e["name"] == "pyramid")
    e_b = next(e for e in b["entries"] if e["name"] == "pyramid")
    n_a = sum(len(t["per_sample"]) for t in e_a["tasks"].values())
    n_b = sum(len(t["per_sample"]) for t in e_b["tasks"].values())
    r = by_name(c)["pyramid"]
    assert r.kv_bytes == pytest.approx((e_a["kv_bytes"] * n_a + e_b["kv_bytes"] * n_b) / (n_a + n_b))
    assert r.kv_ratio == pytest.approx(r.kv_bytes / r.full_kv_bytes)


def test_a_row_missing_from_a_shard_has_no_score_on_the_sharded_suite():
    doc = json.loads(V2.read_text())
    a, b = shard(doc, SHARDS[0]), shard(doc, SHARDS[1])
    b["entries"] = [e for e in b["entries"] if e["name"] != "pyramid"]
    c = cmp.compare([a, b])
    r = by_name(c)["pyramid"]
    assert "broad" not in r.suites and "ruler" not in r.suites
    assert any("pyramid has no broad/manyshot" in w for w in c.warnings)
    assert by_name(c)["uniform-tova"].suites.keys() == {"broad", "ruler"}


def test_overlapping_task_sets_of_the_same_samples_compare_as_the_one_file(whole):
    """A file of some tasks beside one of others that repeats a task on the same samples (the same
    fingerprint), e.g. a whole-suite run beside per-task runs of further entries on the same draw."""
    doc = json.loads(V2.read_text())
    a = shard(doc, SHARDS[0])
    b = shard(doc, ("broad/continuation", "broad/manyshot", "ruler/vt"))
    c = cmp.compare([a, b])
    assert not c.warnings and len(c.runs) == 1
    rows, ref = by_name(c), by_name(whole)
    assert rows.keys() == ref.keys()
    for name, r in rows.items():
        assert r.suites == pytest.approx(ref[name].suites)
        assert (r.suite_iv, r.task_iv, r.diff, r.gap_iv) == (
            ref[name].suite_iv,
            ref[name].task_iv,
            ref[name].diff,
            ref[name].gap_iv,
        )


@pytest.mark.parametrize("fingerprint", [None, "other-draw"])
def test_overlapping_unequal_task_sets_without_the_same_fingerprint_are_different_samples(fingerprint):
    doc = json.loads(V2.read_text())
    a = shard(doc, SHARDS[0])
    b = shard(doc, ("broad/continuation", "broad/manyshot", "ruler/vt"))
    for d in (a, b) if fingerprint is None else (b,):
        d["provenance"]["tasks"]["broad/continuation"]["samples"] = fingerprint
    with pytest.raises(cmp.CompareError, match="different samples") as err:
        cmp.compare([a, b])
    assert ("suite broad has tasks" in str(err.value)) == (fingerprint is None)


def test_cli_compares_shards(tmp_path, capsys):
    doc = json.loads(V2.read_text())
    paths = []
    for i, tasks in enumerate(SHARDS):
        p = tmp_path / f"shard{i}.json"
        p.write_text(json.dumps(shard(doc, tasks)))
        paths.append(str(p))
    assert main(["compare", *paths, "--json", str(tmp_path / "c.json")]) == 0
    saved = json.loads((tmp_path / "c.json").read_text())
    assert {r["name"] for r in saved["rows"]} == {r.name for r in cmp.compare([doc]).rows}


def test_the_description_names_every_shard_seed():
    doc = json.loads(V2.read_text())
    a, b = shard(doc, SHARDS[0]), shard(doc, SHARDS[1])
    a["provenance"]["settings"]["seed"], b["provenance"]["settings"]["seed"] = 0, 1
    assert "seeds 0, 1" in cmp.describe(cmp.compare([a, b]))
    b["provenance"]["settings"]["seed"] = 0
    assert "seed 0," in cmp.describe(cmp.compare([a, b]))


def test_level_sets_every_interval_and_the_notes(tmp_path, capsys):
    path = str(tmp_path / "v2.json")
    Path(path).write_text(V2.read_text())
    out = tmp_path / "c.json"
    assert main(["compare", path, "--level", "0.99", "--json", str(out), "--markdown"]) == 0
    assert "half-width of the 99% paired bootstrap" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    wide = cmp.compare([json.loads(V2.read_text())], level=0.99)
    row = next(r for r in wide.rows if r.name == "pyramid")
    kept = next(r for r in saved["rows"] if r["name"] == "pyramid")
    assert kept["intervals"]["suites"]["broad"]["level"] == 0.99
    assert kept["intervals"]["suites"]["broad"]["half_width"] == pytest.approx(row.suite_iv["broad"].half_width)
    for bad in ("1", "0", "1.5", "high"):
        assert main(["compare", path, "--level", bad]) == 2
        err = capsys.readouterr().err
        assert "--level" in err and "Traceback" not in err
