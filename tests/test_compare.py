"""compare: hand-made results, gap recovered by hand, refusals on mismatched runs, markdown, plots."""

from __future__ import annotations

import json

import pytest

from polykv_search import compare as cmp
from polykv_search.cli import main
from strategies import Strategy

L = 4
SAMPLES = {"ruler/niah_single": "aaaa", "broad/continuation": "bbbb"}


def strategy(kind: str, budget: float | None = 64) -> Strategy:
    if kind == "full":
        return Strategy.full(L)
    if kind.startswith("uniform-"):
        return Strategy.uniform(L, kind.split("-", 1)[1], int(budget))
    b = int(budget)
    if kind == "proportional":  # heterogeneous patterns and budgets, sums to L*B
        prefill = [("streaming_llm", b + b // 2), ("snapkv", b + b // 4), ("h2o", b - b // 4), ("tova", b - b // 2)]
        return Strategy.from_choices(
            prefill, [("tova", b)] * L, float(b), solver="proportional", settings={"preference": "cosine"}
        )
    if kind == "pyramid":
        return Strategy.from_choices(
            [("pyramidkv", b + 8), ("pyramidkv", b + 4), ("pyramidkv", b - 4), ("pyramidkv", b - 8)],
            [("pyramidkv", b)] * L,
            float(b),
            solver="pyramid",
        )
    raise ValueError(kind)


def entry(name: str, suites: dict[str, float], budget: float | None = 64, kind: str | None = None) -> dict:
    s = strategy(kind or name, budget)
    full_bytes = 1000 * 2**20 / 100  # 10 MiB
    ratio = 1.0 if s.is_full else budget / 512
    scores = {t: suites[t.split("/")[0]] for t in SAMPLES if t.split("/")[0] in suites}
    return {
        "name": name,
        "kind": "baseline" if (kind or name) in ("full", "uniform-snapkv", "uniform-tova", "pyramid") else "strategy",
        "source": name,
        "strategy_digest": s.digest(),
        "global_budget": s.global_budget,
        "solver": s.provenance.get("solver"),
        "strategy": s.to_json(),
        "scores": scores,
        "suites": dict(suites),
        "extra": {},
        "kv_bytes": full_bytes * ratio,
        "full_kv_bytes": full_bytes,
        "kv_ratio": ratio,
        "seconds": 1.0,
        "tasks": {},
    }


def doc(
    entries: list[dict], budget: float | None = 64, model_fp: str = "m1", samples: dict | None = None, **settings
) -> dict:
    samples = SAMPLES if samples is None else samples
    return {
        "schema": "polykv-results",
        "version": 1,
        "provenance": {
            "model": "tiny",
            "model_fingerprint": model_fp,
            "settings": {
                "budget": budget,
                "samples": 2,
                "context_len": 512,
                "seed": 0,
                "decode_interval": 1,
                **settings,
            },
            "tasks": {t: {"version": "1", "suite": t.split("/")[0], "samples": fp} for t, fp in samples.items()},
        },
        "entries": entries,
    }


# ruler: best uniform = tova (50); broad: best uniform = snapkv (70)
FULL = {"ruler": 80.0, "broad": 90.0}
SNAP = {"ruler": 40.0, "broad": 70.0}
TOVA = {"ruler": 50.0, "broad": 60.0}
PROP = {"ruler": 65.0, "broad": 65.0}


def standard(budget: float = 64, **kw) -> dict:
    return doc(
        [
            entry("proportional", PROP, budget),
            entry("full", FULL, None),
            entry("uniform-snapkv", SNAP, budget),
            entry("uniform-tova", TOVA, budget),
        ],
        budget,
        **kw,
    )


def row(c: cmp.Comparison, name: str, budget: float | None = 64) -> cmp.Row:
    (r,) = [r for r in c.rows if r.name == name and r.budget == budget]
    return r


def write(tmp_path, name: str, d: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return str(path)


# ------------------------------------------------------------------------------ gap recovered
def test_gap_recovered_by_hand():
    c = cmp.compare([standard()])
    prop = row(c, "proportional")
    assert prop.gap["ruler"] == pytest.approx((65 - 50) / (80 - 50))  # 0.5
    assert prop.gap["broad"] == pytest.approx((65 - 70) / (90 - 70))  # -0.25
    assert row(c, "uniform-tova").gap == pytest.approx({"ruler": 0.0, "broad": (60 - 70) / 20})
    assert row(c, "uniform-snapkv").gap == pytest.approx({"ruler": (40 - 50) / 30, "broad": 0.0})
    assert row(c, "full", None).gap == {}


def test_best_uniform_is_chosen_per_suite():
    c = cmp.compare([standard()])
    group = [r for r in c.rows if r.budget == 64]
    assert cmp.best_uniform(group, "ruler").name == "uniform-tova"
    assert cmp.best_uniform(group, "broad").name == "uniform-snapkv"
    # a non-uniform baseline that scores higher is not the reference
    c = cmp.compare([doc(standard()["entries"] + [entry("pyramid", {"ruler": 79.0, "broad": 89.0})])])
    refs = {r.suite: r for r in c.references}
    assert refs["ruler"].best_uniform == "uniform-tova" and refs["ruler"].s_best_uniform == 50.0
    assert refs["broad"].best_uniform == "uniform-snapkv" and refs["broad"].s_full == 90.0
    assert row(c, "pyramid").gap["ruler"] == pytest.approx(29 / 30)


def test_gap_is_none_without_full_or_uniform_or_when_they_tie():
    assert cmp.gap_recovered(60, 50, 50) is None
    assert cmp.gap_recovered(60, 50, 45) is None  # uniform beats FullKV: no gap to recover
    assert cmp.gap_recovered(60, None, 80) is None and cmp.gap_recovered(60, 50, None) is None
    no_full = cmp.compare([doc([entry("proportional", PROP), entry("uniform-tova", TOVA)])])
    assert row(no_full, "proportional").gap == {"ruler": None, "broad": None}
    no_uniform = cmp.compare([doc([entry("proportional", PROP), entry("full", FULL, None)])])
    assert row(no_uniform, "proportional").gap == {"ruler": None, "broad": None}
    tie = cmp.compare(
        [
            doc(
                [
                    entry("proportional", PROP),
                    entry("full", FULL, None),
                    entry("uniform-tova", {"ruler": 80.0, "broad": 60.0}),
                ]
            )
        ]
    )
    assert row(tie, "proportional").gap == pytest.approx({"ruler": None, "broad": (65 - 60) / 30})
    md = cmp.to_markdown(no_full)
    assert "| - | - |" in md and "gap -: no FullKV score on ruler" in cmp.notes(no_full)


# ---------------------------------------------------------------------------- merging / dedup
def test_rows_are_deduplicated_by_digest_and_budget_across_files():
    a = doc([entry("full", FULL, None), entry("uniform-tova", TOVA)])
    b = doc([entry("full", FULL, None), entry("uniform-snapkv", SNAP), entry("proportional", PROP)])
    c = cmp.compare([a, b], sources=["a.json", "b.json"])
    assert [r.name for r in c.rows] == ["full", "uniform-tova", "uniform-snapkv", "proportional"]
    assert row(c, "full", None).sources == ["a.json", "b.json"]
    assert row(c, "proportional").gap["ruler"] == pytest.approx(0.5)
    assert not c.warnings


def test_files_without_a_newer_engine_setting_merge_with_files_that_record_it():
    """decode_batch (recorded since it was added) changes no score: a file without it, or with another value,
    merges without a runtime-settings warning."""
    old, new, other = standard(), standard(decode_batch=8), standard(decode_batch=2)
    c = cmp.compare([old, new, other], sources=["old.json", "new.json", "other.json"])
    assert len(c.runs) == 1 and not c.warnings
    assert row(c, "proportional").gap["ruler"] == pytest.approx(0.5)


def test_same_strategy_under_two_names_is_one_row_named_by_the_baseline():
    same = entry("uniform-tova", TOVA)
    as_file = dict(same, name="my_tova", kind="strategy")
    c = cmp.compare([doc([as_file, entry("full", FULL, None), same])])
    r = row(c, "uniform-tova")
    assert r.aliases == ["my_tova"] and r.is_uniform and len(c.rows) == 2


# -------------------------------------------------------------------------------- refusals
def test_refuses_different_samples_unless_allowed():
    a, b = standard(), standard(samples={"ruler/niah_single": "zzzz", "broad/continuation": "bbbb"})
    with pytest.raises(cmp.CompareError, match="different samples .*ruler/niah_single.*--allow-mismatch"):
        cmp.compare([a, b])
    c = cmp.compare([a, b], sources=["a.json", "b.json"], allow_mismatch=True)
    assert len(c.runs) == 2 and c.warnings
    # each run keeps its own rows and references
    assert [r.run for r in c.rows].count(1) == 4
    assert all(r.gap["ruler"] == pytest.approx(0.5) for r in c.rows if r.solver == "proportional")
    assert "run" in cmp.to_markdown(c).splitlines()[0]


def test_refuses_a_suite_with_different_tasks_unless_allowed_or_the_shared_task_is_fingerprinted_alike():
    a = standard(samples={"ruler/niah_single": None, "broad/continuation": "bbbb"})
    b = standard(samples={"ruler/niah_single": None, "ruler/vt": "cccc", "broad/continuation": "bbbb"})
    with pytest.raises(cmp.CompareError, match="suite ruler"):
        cmp.compare([a, b])
    cmp.compare([a, b], allow_mismatch=True)
    a, b = standard(), standard(samples={"ruler/niah_single": "aaaa", "ruler/vt": "cccc", "broad/continuation": "bbbb"})
    c = cmp.compare([a, b])  # niah_single: the same samples in both, so one run with ruler's tasks merged
    assert len(c.runs) == 1 and any("no ruler/vt" in w for w in c.warnings)


def test_refuses_different_models_unless_allowed():
    a, b = standard(), standard(model_fp="m2")
    with pytest.raises(cmp.CompareError, match="different models.*--allow-mismatch"):
        cmp.compare([a, b])
    assert len(cmp.compare([a, b], allow_mismatch=True).runs) == 2


def test_refuses_different_budgets_unless_across_budgets():
    a, b = standard(64), standard(128)
    with pytest.raises(cmp.CompareError, match="different budgets.*--across-budgets"):
        cmp.compare([a, b])
    # --allow-mismatch is not enough for budgets
    with pytest.raises(cmp.CompareError, match="--across-budgets"):
        cmp.compare([a, b], allow_mismatch=True)
    c = cmp.compare([a, b], across_budgets=True)
    assert c.budgets == [64.0, 128.0]
    assert [(r.name, r.budget) for r in c.rows][:2] == [("full", None), ("uniform-snapkv", 64.0)]
    assert len(c.rows) == 7  # FullKV once, 3 rows per budget
    assert {(r.budget, r.suite): r.best_uniform for r in c.references} == {
        (64.0, "ruler"): "uniform-tova",
        (64.0, "broad"): "uniform-snapkv",
        (128.0, "ruler"): "uniform-tova",
        (128.0, "broad"): "uniform-snapkv",
    }


def test_gap_is_computed_within_each_budget_group():
    a = standard(64)
    b = doc(
        [
            entry("uniform-tova", {"ruler": 70.0, "broad": 80.0}, 128),
            entry("proportional", {"ruler": 75.0, "broad": 85.0}, 128),
        ],
        128,
    )
    c = cmp.compare([a, b], across_budgets=True)
    assert row(c, "proportional", 64).gap["ruler"] == pytest.approx(0.5)
    assert row(c, "proportional", 128).gap["ruler"] == pytest.approx((75 - 70) / (80 - 70))
    assert row(c, "proportional", 128).gap["broad"] == pytest.approx((85 - 80) / (90 - 80))


def test_cli_refusal_is_one_line_exit_2(tmp_path, capsys):
    a = write(tmp_path, "a.json", standard(64))
    b = write(tmp_path, "b.json", standard(64, model_fp="m2"))
    c = write(tmp_path, "c.json", standard(128))
    for args in ([a, b], [a, c]):
        assert main(["compare", *args, "--json", str(tmp_path / "out.json")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "Traceback" not in err
    assert not (tmp_path / "out.json").exists()
    assert main(["compare", a, b, "--allow-mismatch"]) == 0
    assert main(["compare", a, c, "--across-budgets"]) == 0
    assert main(["compare", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "polykv-strategy"}))
    assert main(["compare", str(tmp_path / "bad.json")]) == 2
    assert "polykv-results" in capsys.readouterr().err


# --------------------------------------------------------------------------------- rendering
def test_markdown_exact_for_a_small_case():
    d = doc(
        [
            entry("full", {"ruler": 80.0}, None),
            entry("uniform-snapkv", {"ruler": 40.0}),
            entry("uniform-tova", {"ruler": 50.0}),
            entry("proportional", {"ruler": 65.0}),
        ],
        samples={"ruler/niah_single": "aaaa"},
    )
    d["entries"][3]["kv_bytes"] *= 0.5
    d["entries"][3]["kv_ratio"] *= 0.5
    assert cmp.to_markdown(cmp.compare([d])) == (
        "| entry | B | ruler | KV MiB | KV % FullKV | gap ruler |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        "| full | - | 80.0 | 10.00 | 100.0% | ref |\n"
        "| uniform-snapkv | 64 | 40.0 | 1.25 | 12.5% | - |\n"
        "| uniform-tova | 64 | 50.0 | 1.25 | 12.5% | - |\n"
        "| proportional | 64 | **65.0** | **0.62** | **6.2%** | - |\n"
    )  # no per-sample scores: FullKV - best uniform cannot be resolved, so no gap figure
    with_tasks = cmp.to_markdown(cmp.compare([d]), tasks=True).splitlines()
    assert with_tasks[0] == "| entry | B | ruler/niah_single | ruler | KV MiB | KV % FullKV | gap ruler |"
    assert with_tasks[-1].startswith("| proportional | 64 | **65.0** | **65.0** |")


def test_cli_prints_table_markdown_and_writes_json(tmp_path, capsys):
    a = write(tmp_path, "a.json", standard())
    assert main(["compare", a, "--markdown", "--json", str(tmp_path / "c.json")]) == 0
    printed = capsys.readouterr().out
    verdict, table = printed.split("\n\n", 1)  # the verdict's lines, then the table
    assert verdict.startswith("At B = 64 nothing is resolved: no recommendation.") and len(verdict.splitlines()) <= 3
    assert table.startswith("| entry | B | ruler | broad |") and "| proportional | 64 |" in printed
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["schema"] == "polykv-comparison"
    prop = next(r for r in saved["rows"] if r["name"] == "proportional")
    assert prop["gap_recovered"] == pytest.approx({"ruler": 0.5, "broad": -0.25})
    assert main(["compare", a, "--tasks"]) == 0
    out = capsys.readouterr().out
    assert "proportional" in out and "65.0" in out and "niah_single" in out


# ------------------------------------------------------------------------------------- plots
def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_single_budget(tmp_path):
    c = cmp.compare([doc(standard()["entries"] + [entry("pyramid", {"ruler": 60.0, "broad": 60.0})])])
    assert [r.family for r in c.rows if r.budget] == ["uniform-snapkv", "uniform-tova", "pyramid", "proportional"]
    cmp.plot(c, tmp_path / "one.png")
    assert _is_png(tmp_path / "one.png")


def test_families_follow_the_budget_suffix_and_never_collide():
    def named(name, budget, suites):  # a proportional-solver strategy, different per name
        e = entry(name, suites, budget, kind="proportional")
        pattern = "snapkv" if name == "proportional" else "h2o"
        s = Strategy.from_choices([(pattern, budget)] * L, [("tova", budget)] * L, float(budget), solver="proportional")
        e.update(name=f"{name}-B{budget}", strategy=s.to_json(), strategy_digest=s.digest())
        return e

    docs = [
        doc(
            [entry("full", FULL, None)]
            + [named(n, 64, {"ruler": 60.0, "broad": 60.0}) for n in ("proportional", "patterns-only")],
            64,
        ),
        doc([named(n, 128, {"ruler": 70.0, "broad": 70.0}) for n in ("proportional", "patterns-only")], 128),
    ]
    c = cmp.compare(docs, across_budgets=True)
    fams = {(r.family, r.budget) for r in c.rows if r.budget}
    assert fams == {("proportional", 64.0), ("patterns-only", 64.0), ("proportional", 128.0), ("patterns-only", 128.0)}
    # same name and budget twice (different strategies): the second gets its own family
    dup = entry("proportional", PROP, 64, kind="pyramid")
    dup["name"] = "proportional"
    c = cmp.compare([doc([entry("proportional", PROP), dup])])
    assert len({(r.family, r.budget) for r in c.rows}) == 2


def test_plot_several_budgets_via_cli(tmp_path):
    paths = [write(tmp_path, f"r{b}.json", standard(b)) for b in (32, 64, 128)]
    assert main(["compare", *paths, "--across-budgets", "--plot", str(tmp_path / "sweep.png")]) == 0
    assert _is_png(tmp_path / "sweep.png")


def test_plot_without_non_uniform_strategies_still_draws(tmp_path):
    c = cmp.compare([doc([entry("full", FULL, None), entry("uniform-tova", TOVA)])])
    cmp.plot(c, tmp_path / "bars.png")
    assert _is_png(tmp_path / "bars.png")


def test_plot_stacks_a_head_group_layers_groups_by_their_share_of_the_mean_budget(tmp_path):
    from polykv_search.compare.plots import _segments
    from strategies import HeadGroup, LayerChoice

    g = LayerChoice.grouped([HeadGroup((1,), "full", 1024), HeadGroup((0, 2), "streaming_llm", 48)])
    layer = Strategy([g] + [LayerChoice("snapkv", 64)] * (L - 1), [g] * L, 400.0, context_len=1024, num_kv_heads=3)
    choice = layer.to_json()["layers"][0]["prefill"]
    assert _segments(choice) == [("full", 1024 / 3), ("streaming_llm", 32.0)]  # sums to the layer's mean, 373.3
    assert _segments(layer.to_json()["layers"][1]["prefill"]) == [("snapkv", 64)]
    e = entry("proportional", PROP)
    e.update(name="ilp-head", strategy=layer.to_json(), strategy_digest=layer.digest())
    c = cmp.compare([doc(standard()["entries"] + [e])])
    cmp.plot(c, tmp_path / "heads.png")  # the quickstart's compare --plot with its head-level entry
    assert _is_png(tmp_path / "heads.png")
