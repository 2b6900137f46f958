"""compare's recommendation: the rule of ``compare --help`` on results built so that it must pick a winner,
break a tie by memory (or KL), find nothing resolved, or find no entry near the best on every suite; the
verdict of at most three lines, the table once in 80 columns, and the export command that works."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from polykv_search import compare as cmp
from polykv_search.cli import build_parser, common, main
from polykv_search.compare.deploy import deployment
from polykv_search.compare.recommend import RULE, SPLIT, TIE, UNRESOLVED, WINNER, brief, export_block, recommend
from polykv_search.compare.verdict import samples_to_resolve
from strategies import Strategy
from tests.compare_support import SUITE_TASKS, V2, write

KEEP = ("full", "uniform-h2o", "uniform-snapkv", "ilp-B64", "cake-B64")
N = 12  # samples per task in the fixture
BASE = {"broad/continuation": 40.0, "broad/manyshot": 50.0, "ruler/niah_single": 30.0, "ruler/vt": 20.0}


def series(base: float, swing: float = 0.0, phase: int = 0) -> list[float]:
    """Per-sample scores around ``base``: a spread every entry shares (so that every task has a variance),
    plus ``swing`` added and taken away on alternate samples (a difference whose mean is 0 on its own)."""
    return [float(base + 5 * (i % 3) + swing * (-1) ** (i + phase)) for i in range(N)]


def results(shift: dict[str, dict[str, float]], swing: dict[str, tuple[float, int]] | None = None, **changes) -> dict:
    """The v2 fixture reduced to KEEP: each entry's per-sample scores are the common series plus
    ``shift[name][suite]`` (FullKV: +40), swinging by ``swing[name] = (size, phase)``; ``changes[name]``
    updates its entry."""
    doc = json.loads(V2.read_text())
    doc["entries"] = [e for e in doc["entries"] if e["name"] in KEEP]
    for e in doc["entries"]:
        name = e["name"]
        for task, base in BASE.items():
            suite = task.split("/")[0]
            add = 40.0 if name == "full" else shift[name][suite]
            scores = series(base + add, *(swing or {}).get(name, (0.0, 0)))
            for row, score in zip(e["tasks"][task]["per_sample"], scores, strict=True):
                row["score"] = score
            e["tasks"][task]["score"] = e["scores"][task] = float(np.mean(scores))
        for suite, tasks in SUITE_TASKS.items():
            e["suites"][suite] = float(np.mean([e["scores"][t] for t in tasks]))
        e.update(changes.get(name, {}))
    return doc


def compared(doc: dict) -> cmp.Comparison:
    return cmp.compare([doc], resamples=999)


def kv(ratio: float) -> dict:
    full_bytes = 10 * 2**20
    return {"kv_ratio": ratio, "kv_bytes": ratio * full_bytes}


def kl(value: float) -> dict:
    """Every per-sample KL of the entry's teacher-forced task set to ``value``."""
    return {"_kl": value}


def with_kl(doc: dict) -> dict:
    for e in doc["entries"]:
        value = e.pop("_kl", None)
        if value is not None:
            for row in e["tasks"]["broad/continuation"]["per_sample"]:
                row["kl"] = value
            e["extra"]["broad/continuation"]["kl"] = value
    return doc


EVEN = {"broad": 0.0, "ruler": 0.0}


# ------------------------------------------------------------------------------------------ the rule
def test_compare_help_states_the_rule(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["compare", "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert " ".join(RULE.split()) in shown
    for words in ("least KV memory", "ties broken by the lower mean KL", "not resolved below the best entry"):
        assert words in shown


def test_a_winner_is_the_one_entry_not_resolved_below_the_best_on_any_suite():
    # ilp 10 points above everything on both suites, sample by sample: every other entry resolved below it
    shift = {"uniform-h2o": EVEN, "uniform-snapkv": {"broad": -5, "ruler": -5}, "cake-B64": {"broad": -3, "ruler": 0}}
    c = compared(results({**shift, "ilp-B64": {"broad": 10, "ruler": 10}}))
    (r,) = recommend(c)
    assert (r.kind, r.entry, r.kept) == (WINNER, "ilp-B64", ("ilp-B64",))
    assert r.best == {"broad": "ilp-B64", "ruler": "ilp-B64"}
    assert r.reasons[0].startswith("broad: the best, ") and "3 others resolved below it" in r.reasons[0]
    lines = brief(c, [r])
    assert lines[0] == "Use ilp-B64 at B = 64: 12.5 % of FullKV's KV cache."
    assert lines[1] == "Why: all others are resolved below the best on a suite (12 samples per task)."
    assert lines[2] == "kvpress: export it with the command under the table."
    assert export_block([r]) == [
        "# ilp-B64 at B = 64, for kvpress:",
        "polykv-search export strategies/ilp-B64.json --format kvpress \\",
        "    --out ilp_B64_press.py",
    ]


def test_a_tie_goes_to_the_least_memory_then_to_the_lower_kl():
    # h2o and ilp tie (ilp swings around h2o: a difference of mean 0); snapkv and cake are resolved below both
    shift = {
        "uniform-h2o": EVEN,
        "ilp-B64": EVEN,
        "uniform-snapkv": {"broad": -8, "ruler": -8},
        "cake-B64": {"broad": -10, "ruler": -10},
    }
    swing = {"ilp-B64": (3.0, 0)}
    c = compared(results(shift, swing, **{"ilp-B64": kv(0.1)}))
    (r,) = recommend(c)
    assert (r.kind, r.broken_by, set(r.kept)) == (TIE, "memory", {"uniform-h2o", "ilp-B64"})
    assert r.entry == "ilp-B64"  # 10.0 % of FullKV's cache against h2o's 12.5 %
    assert any(line.startswith("kept 2: ilp-B64 10.0 % (the least memory); uniform-h2o 12.5 %") for line in r.reasons)
    assert brief(c, [r])[1] == "Why: least memory of the 2 not resolved below the best (12 samples per task)."
    # the same memory: the lower KL(FullKV‖entry) decides
    doc = with_kl(results(shift, swing, **{"uniform-h2o": kl(0.30), "ilp-B64": kl(0.20)}))
    (r,) = recommend(compared(doc))
    assert (r.kind, r.broken_by, r.entry) == (TIE, "kl", "ilp-B64")


def test_with_nothing_resolved_there_is_no_recommendation_and_the_samples_that_would_decide():
    # ilp a point above the others on both suites, every difference swinging by 6 or 12 points
    swing = {"uniform-snapkv": (6.0, 0), "ilp-B64": (6.0, 1), "cake-B64": (3.0, 0)}
    shift = {"uniform-h2o": EVEN, "uniform-snapkv": EVEN, "ilp-B64": {"broad": 1, "ruler": 1}, "cake-B64": EVEN}
    c = compared(results(shift, swing))
    (r,) = recommend(c)
    assert (r.kind, r.entry, r.deployment) == (UNRESOLVED, None, None)
    assert set(r.kept) == set(r.candidates) == {"uniform-h2o", "uniform-snapkv", "ilp-B64", "cake-B64"}
    # the fewest samples per task that would likely resolve a candidate's difference to a suite's best
    expected = []
    for suite, tasks in SUITE_TASKS.items():
        best = max((row for row in c.rows if not row.is_full), key=lambda row: row.suites[suite])
        for row in c.rows:
            if not row.is_full and row is not best:
                a = [row.samples[t].score for t in tasks]
                b = [best.samples[t].score for t in tasks]
                expected.append(samples_to_resolve(a, b))
    assert r.samples_needed == min(n for n in expected if n is not None) and r.samples_now == N
    lines = brief(c, [r])
    assert lines[0] == "At B = 64 nothing is resolved: no recommendation."
    assert (
        lines[1] == f"Nothing resolved at 12 samples per task; about {r.samples_needed:,} per task would likely decide."
    )
    assert len(lines) == 2 and export_block([r]) == []
    # which difference would resolve first, under the table
    assert r.reasons[-1].startswith("the first to resolve: ") and f"about {r.samples_needed:,} samples" in r.reasons[-1]


def test_when_each_suites_best_is_resolved_below_on_the_other_no_single_entry_is_recommended():
    shift = {
        "ilp-B64": {"broad": 10, "ruler": -10},
        "cake-B64": {"broad": -10, "ruler": 10},
        "uniform-h2o": {"broad": -20, "ruler": -20},
        "uniform-snapkv": {"broad": -20, "ruler": -20},
    }
    (r,) = recommend(compared(results(shift)))
    assert (r.kind, r.entry, r.kept) == (SPLIT, None, ())
    assert r.best == {"broad": "ilp-B64", "ruler": "cake-B64"}


# ------------------------------------------------------------------------------------ the terminal
def test_the_terminal_shows_at_most_three_lines_then_the_table_once_in_80_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common.out, "width", 80)
    shift = {"uniform-h2o": EVEN, "ilp-B64": EVEN, "uniform-snapkv": {"broad": -8, "ruler": -8}, "cake-B64": EVEN}
    doc = results(shift, {"ilp-B64": (3.0, 0), "cake-B64": (3.0, 1)})
    names = {"uniform-snapkv": "uniform-kvzip[allocation=model]", "cake-B64": "ilp-head-B64"}  # the quickstart's
    for e in doc["entries"]:
        e["name"] = names.get(e["name"], e["name"])
    path = write(tmp_path, "r.json", doc)
    assert main(["compare", path, "--resamples", "300", "--json", str(tmp_path / "c.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = [i for i, line in enumerate(lines) if line.lstrip().startswith("entry")]
    assert len(header) == 1  # the table once
    assert header[0] - 1 <= 3  # at most three lines, then the table's two-line header
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    end = next(i for i in range(rule + 1, len(lines)) if not lines[i].startswith(("full", "uniform", "ilp", " ")))
    table = lines[header[0] - 1 : end]
    assert max(len(line) for line in table) <= 80 and not any("…" in line for line in table)
    # the export commands right under the table, set apart by blank lines, then the details
    block = lines[end + 1 : lines.index("", end + 1)]
    assert lines[end] == "" and block[0] == "# ilp-head-B64 at B = 64, for kvpress:" and len(block) >= 2
    after = end + len(block) + 2
    assert lines[after].startswith("compare — ") and lines[after + 1].startswith("Recommendation at B = 64")
    saved = json.loads((tmp_path / "c.json").read_text())["recommendation"]
    assert saved["rule"] == RULE and saved["brief"] == lines[: header[0] - 1]
    # ilp-head-B64 is the fixture's cake entry renamed: 12.1 % of the cache, the least of the tied entries
    assert saved["budgets"][0]["kind"] == TIE and saved["budgets"][0]["entry"] == "ilp-head-B64"


def test_gap_recovered_is_a_dash_with_a_note_when_fullkv_minus_the_best_uniform_is_not_resolved(tmp_path, capsys):
    doc = results({n: EVEN for n in KEEP if n != "full"})
    full = next(e for e in doc["entries"] if e["name"] == "full")
    h2o = next(e for e in doc["entries"] if e["name"] == "uniform-h2o")
    for task in SUITE_TASKS["ruler"]:  # FullKV ties the best uniform on ruler, sample by sample
        full["tasks"][task] = json.loads(json.dumps(h2o["tasks"][task]))
        full["scores"][task] = h2o["scores"][task]
    full["suites"]["ruler"] = h2o["suites"]["ruler"]
    c = compared(doc)
    assert not c.reference(0, 64.0, "ruler").gap_defined and c.reference(0, 64.0, "broad").gap_defined
    gap_ruler, gap_broad = cmp.Column("gap:ruler", "", "high"), cmp.Column("gap:broad", "", "high")
    for r in c.rows:
        if not r.is_full:
            assert cmp.tables.text(c, r, gap_ruler, details=False) == "-"
            assert cmp.tables.text(c, r, gap_broad, details=False).endswith("%")
    assert any(line.startswith("gap -: FullKV − best uniform (uniform-h2o) on ruler") for line in cmp.notes(c))


LONG = {  # the quickstart's longest names: KVzip's uniform, a retrieval-aware, question-aware head-level solve
    "uniform-snapkv": "uniform-kvzip[allocation=model]",
    "cake-B64": "ilp-head-retrieval-question-aware-B64",
}
KINDS = {
    WINNER: (
        {"uniform-h2o": EVEN, "uniform-snapkv": EVEN, "cake-B64": EVEN, "ilp-B64": {"broad": 10, "ruler": 10}},
        {},
    ),
    TIE: (
        {"uniform-h2o": EVEN, "ilp-B64": {"broad": -9, "ruler": -9}, "uniform-snapkv": EVEN, "cake-B64": EVEN},
        {"uniform-snapkv": (3.0, 0), "cake-B64": (3.0, 1)},
    ),
    UNRESOLVED: (
        {"uniform-h2o": EVEN, "uniform-snapkv": EVEN, "ilp-B64": {"broad": 1, "ruler": 1}, "cake-B64": EVEN},
        {"uniform-snapkv": (6.0, 0), "ilp-B64": (6.0, 1), "cake-B64": (3.0, 0)},
    ),
    SPLIT: (
        {
            "ilp-B64": {"broad": 10, "ruler": -10},
            "cake-B64": {"broad": -10, "ruler": 10},
            "uniform-h2o": {"broad": -20, "ruler": -20},
            "uniform-snapkv": {"broad": -20, "ruler": -20},
        },
        {},
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_verdict_line_and_export_line_fits_80_columns_with_the_quickstarts_longest_names(kind):
    import dataclasses

    shift, swing = KINDS[kind]
    doc = results(shift, swing)
    for e in doc["entries"]:
        e["name"] = LONG.get(e["name"], e["name"])
        if e["name"].startswith("ilp-head"):
            e["source"] = f"polykv-quickstart/strategies/{e['name']}.json"
    c = compared(doc)
    (r,) = recommend(c)
    assert r.kind == kind
    for found in (
        [r],
        [r, dataclasses.replace(r, budget=128.0)],
        [dataclasses.replace(r, budget=b) for b in (32, 64, 96, 128)],
    ):
        lines = brief(c, found)
        assert 1 <= len(lines) <= 3 and all(len(line) <= 80 for line in lines), lines
        assert all(len(line) <= 80 for line in export_block(found))
    assert all(len(line) <= 80 for line in r.lines())


def test_a_wrapped_export_command_is_the_same_command_to_the_shell():
    import shlex

    from polykv_search.compare.deploy import wrap_command

    make = (
        "polykv-search solve --method uniform --pattern 'kvzip[allocation=model]' --budget 128 --b-min 1 "
        "--num-layers 30 --out uniform_kvzip_allocation_model.json"
    )
    for command in (make, "polykv-search export 'my strategies/a b.json' --format kvpress --out a_press.py", "ls"):
        lines = wrap_command(command)
        assert all(len(line) <= 80 for line in lines) and all(line.endswith(" \\") for line in lines[:-1])
        assert shlex.split("\n".join(lines).replace("\\\n", " ")) == shlex.split(command)
    assert wrap_command(make)[1:] == [
        "    --budget 128 --b-min 1 --num-layers 30 \\",
        "    --out uniform_kvzip_allocation_model.json",
    ]


# -------------------------------------------------------------------------------------- deployment
def test_a_recommended_uniform_baseline_comes_with_the_commands_that_rebuild_and_export_it(tmp_path, monkeypatch):
    from polykv_search.cli.baselines import baseline

    entry = baseline("uniform:kvzip[allocation=model]", 4, 64.0)
    row = cmp.Row(
        name=entry.name,
        kind="baseline",
        solver="uniform",
        budget=64.0,
        digest=entry.strategy.digest(),
        run=0,
        strategy=entry.strategy.to_json(),
        source="uniform:kvzip[allocation=model]",
    )
    d = deployment(row, "smollm2-135m")
    assert d.make == (
        "polykv-search solve --method uniform --pattern 'kvzip[allocation=model]' --budget 64 --b-min 1 "
        "--num-layers 4 --out uniform_kvzip_allocation_model.json"
    )
    assert d.differences > 0  # kvpress's KVzipPress is not polykv-search's kvzip: the module lists how
    monkeypatch.chdir(tmp_path)
    solve, export = (cmd.split()[1:] for cmd in (d.make.replace("'", ""), d.export))
    assert main(solve) == 0 and Strategy.load(d.strategy_file).digest() == row.digest  # the same strategy
    assert main(export) == 0 and (tmp_path / "uniform_kvzip_allocation_model_press.py").exists()


def test_a_strategy_kvpress_cannot_express_says_why_and_what_the_python_runtime_needs():
    path = Path(__file__).parents[1] / "studies" / "quickstart" / "2026-12-06-ilp-head-B128.json"
    strategy = Strategy.load(path)  # head groups with h2o and KVzip's pool: kvpress has neither per head
    row = cmp.Row("ilp-head-B128", "strategy", "ilp", 128.0, strategy.digest(), 0, strategy=strategy.to_json())
    row.source = "polykv-quickstart/strategies/ilp-head-B128.json"
    d = deployment(row, "smollm2-135m")
    assert d.export is None and d.approximate is None and d.refusal.startswith("kvpress cannot express layer 0")
    assert d.line() == "kvpress cannot express it: apply it with polykv-search's runtime (below)."
    assert d.commands() == [] and any(line.startswith("kvpress cannot express it exactly: ") for line in d.details())
    assert "apply_strategy(model, Strategy.load('polykv-quickstart/strategies/ilp-head-B128.json'))" in d.runtime
    assert "load_model('smollm2-135m')" in d.runtime and math.isfinite(len(d.details()))


def test_the_runtime_snippet_runs_as_printed(tmp_path):
    from polykv_search.compare.deploy import runtime_snippet
    from tests.test_eval_support import char_tokenizer
    from tests.tiny import tiny_model

    ckpt = tmp_path / "tiny-llama"
    tiny_model("llama", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    path = Strategy.uniform(2, "snapkv", 8).save(tmp_path / "s.json")
    code = runtime_snippet(str(path), str(ckpt)).replace('"..."', '"a long enough context to evict from. Q: a?"')
    code = code.replace("max_new_tokens=64", "max_new_tokens=4")  # shorter, for the test's time
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the snippet the recommendation prints, with a prompt filled in
    assert scope["out"].shape[1] > len(scope["prompt"])  # it generated, with the strategy applied
