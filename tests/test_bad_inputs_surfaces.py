"""The surfaces built after the first corpus refuse bad input too (issue 62): pattern specs, head groups and
head tables, cluster back-ends, worker counts, lengths past the model's positions or the machine's memory.

Each CLI row runs as the corpus of ``test_bad_inputs_cases.py`` does (exit code 2, one ``error:`` line, no
traceback, nothing written: no output, no folder, no journal); no model is loaded (``ModelLoaded``), and a
hang fails the test (``time_limit``, :data:`~tests.bad_inputs_support.TIME_LIMIT` seconds).
"""

from __future__ import annotations

import json
import socket

import pytest

from polykv_search import parallel
from tests.bad_inputs_support import (
    SIG,
    ModelLoaded,
    make,
    no_model_no_network,  # noqa: F401  (autouse: no model, no network)
    row,
    run_case,
    snapshot,
    time_limit,  # noqa: F401  (autouse: a hang fails the test)
)

SCORE = "score --baseline full --out o/r.json"
HEADS = {"h.json": "signals-heads"}
FULL1, CTX16 = {"f.json": "strategy-full-budget-1"}, {"h16.json": "strategy-heads-ctx16"}
HUGE = {"m/config.json": "model-config-huge"}
HEAD_SOLVE = "solve --method ilp --granularity head --signals k.json --budget 64 --out o.json"

CASES = [
    # ---- pattern specs: parsed by argparse, inside the error boundary
    row("collect --head-cells 32 --head-patterns snapkv[ --out o.json", "NAME[KEY=VALUE", id="collect-spec-unclosed"),
    row("collect --patterns snapkv[,tova --out o.json", "NAME[KEY=VALUE", id="collect-patterns-unclosed"),
    row("quickstart --head-patterns snapkv[ --out q", "NAME[KEY=VALUE", id="quickstart-spec-unclosed"),
    row("quickstart --patterns snapkv[ --out q", "NAME[KEY=VALUE", id="quickstart-patterns-unclosed"),
    row("solve --patterns h2o[ --budget 64 --signals sig.json --out o.json", "NAME[KEY", SIG, id="solve-spec-unclosed"),
    row(
        "collect --patterns snapkv[window=8,window=16] --out o.json",
        "parameter 'window' is given twice",
        id="collect-spec-param-twice",
    ),
    row(
        f"{SCORE} --baseline uniform:snapkv[window=8]:window=16 --budget 64",
        "parameter 'window' is given twice",
        id="score-uniform-param-twice",
    ),
    # ---- solve: the pattern flag of the other granularity is refused, not ignored
    row(
        f"{HEAD_SOLVE} --patterns snapkv",
        "--patterns names the layer-level table's columns",
        {"k.json": "signals-kvzip-cells"},
        id="solve-patterns-at-head-granularity",
    ),
    row(
        "solve --method ilp --head-patterns h2o --signals k.json --budget 64 --out o.json",
        "--head-patterns chooses among the per-kv-head cells of --granularity head",
        {"k.json": "signals-kvzip-cells"},
        id="solve-head-patterns-at-layer-granularity",
    ),
    # ---- score: flags that do not apply, lengths past the model's positions or this machine's memory
    row(f"{SCORE} --generate-len 64", "--generate-len sets the decode suite's", id="score-generate-len-no-decode"),
    row(
        f"{SCORE} --context-len 100000",
        "over the 8192 of smollm2-135m (max_position_embeddings); give at most",
        id="score-context-over-positions",
    ),
    row(
        f"{SCORE} --suite decode --generate-len 100000",
        "100008 tokens decoded after it (--generate-len, answers)",
        id="score-generate-len-over-positions",
    ),
    row(f"{SCORE} --model ./m --context-len 1000000", "GiB available on cpu; at most about", HUGE, id="score-memory"),
    row(
        "collect --context-len 9000 --out o.json", "over the 8192 of smollm2-135m", id="collect-context-over-positions"
    ),
    row("collect --model ./m --context-len 1000000 --out o.json", "GiB available", HUGE, id="collect-memory"),
    # ---- the budget a user reads must be the memory it holds
    row(
        f"{SCORE} --strategy f.json",
        "f.json: layers[0].prefill holds 1024 tokens per KV head at --context-len 1024 but counts 1 in its B = 16",
        FULL1,
        id="score-full-layer-budget-1",
    ),
    row(
        f"{SCORE} --strategy h16.json",
        "(built for 16-token contexts): layers[0].prefill holds 421.333 tokens per KV head at --context-len 1024",
        CTX16,
        id="score-heads-built-for-16",
    ),
    row(
        "show h.json",
        "head_groups[0].budget: pattern 'full' keeps every token, so it holds the whole 16-token context",
        {"h.json": "strategy-heads-full-1"},
        id="show-full-group-budget-1",
    ),
    # ---- compare --signals: a table that predicts no entry
    row(
        "compare r.json --signals h.json",
        "predicts none of the entries",
        {"r.json": "results", **HEADS},
        id="compare-signals-head-table",
    ),
    # ---- cluster back-ends: an --address the back-end would ignore or misread
    row(f"{SCORE} --backend dask --address auto", "--address auto finds a running ray cluster", id="score-dask-auto"),
    row("collect --backend dask --address auto --out o.json", "--backend dask needs its", id="collect-dask-auto"),
    row(f"{SCORE} --backend dask --address ''", "--address: empty", id="score-address-empty"),
    row("collect --backend ray --address ' ' --out o.json", "--address: empty", id="collect-address-blank"),
    row(
        f"{SCORE} --backend loky --jobs 2 --address tcp://h:1", "does not apply to --backend loky", id="score-loky-addr"
    ),
    row(f"{SCORE} --address tcp://h:1", "applies to --backend dask or ray", id="score-address-no-backend"),
    # ---- quickstart: a solver its tables cannot serve, before either collect step
    row("quickstart --methods duo --no-head-level --out q", "--methods duo: reads per-kv-head", id="quickstart-duo"),
]


@pytest.mark.parametrize("argv,match,files", CASES)
def test_bad_input_is_refused_up_front(argv, match, files, tmp_path, monkeypatch, capsys):
    run_case(argv, match, files, tmp_path, monkeypatch, capsys)


def test_the_rows_cover_every_command_they_name():
    assert {c.id.split("-")[0] for c in CASES} >= {"collect", "quickstart", "solve", "score", "show", "compare"}


# --------------------------------------------------------------------------------------------
# cluster back-ends: refused in seconds, before the model loads, leaving no journal


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["score --baseline full", "collect"])
def test_a_dask_address_nobody_answers_is_refused_in_seconds(command, tmp_path, monkeypatch, capsys):
    pytest.importorskip("distributed")
    import time

    start = time.monotonic()
    address = f"tcp://127.0.0.1:{_closed_port()}"
    argv = f"{command} --backend dask --address {address} --out o.json"
    run_case(argv, "no dask scheduler", {}, tmp_path, monkeypatch, capsys)
    assert time.monotonic() - start < 15 and not (tmp_path / "o.json.journal").exists()


@pytest.mark.parametrize("command", ["score --baseline full", "collect"])
def test_ray_that_is_not_installed_is_refused_before_the_model_loads(command, tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    run_case(f"{command} --backend ray --out o.json", "--backend ray needs ray", {}, tmp_path, monkeypatch, capsys)


def test_an_address_that_answers_passes_the_check(tmp_path):
    from polykv_search.cli.limits import check_backend

    pytest.importorskip("distributed")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_backend("dask", f"tcp://127.0.0.1:{server.getsockname()[1]}")  # no error
        check_backend("dask", None)  # a local cluster: nothing to reach


# --------------------------------------------------------------------------------------------
# --jobs: never more workers than the machine holds


def test_a_runaway_job_count_is_clamped_with_one_notice_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from polykv_search.cli import main

    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    monkeypatch.setattr(parallel, "available_memory", lambda: 64 * 2**30)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoaded):
        main(["score", "--baseline", "full", "--jobs", "100000", "--out", "o.json"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: --jobs 100000 clamped to 2")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------
# done correctly instead of refused


def test_solve_takes_the_head_cells_by_the_name_collect_show_and_the_solver_print(tmp_path, monkeypatch, capsys):
    from polykv_search.cli import main
    from strategies import Strategy

    monkeypatch.chdir(tmp_path)
    make("signals-kvzip-cells", tmp_path / "k.json")
    assert main([*HEAD_SOLVE.split(), "--head-patterns", "kvzip[allocation=model]"]) == 0, capsys.readouterr().err
    s = Strategy.load(tmp_path / "o.json")
    groups = [g for layer in range(s.num_layers) for g in s.head_groups(layer, "prefill")]
    assert {g.pattern for g in groups} <= {"full", "kvzip"}
    assert all(g.params == {"allocation": "model"} for g in groups if g.pattern == "kvzip")
    bad = tmp_path / "bad.json"
    argv = [*HEAD_SOLVE.split()[:-1], str(bad), "--head-patterns", "kvzip[allocation=head]"]
    assert main(argv) == 2 and not bad.exists()
    assert "(streaming_llm,h2o,kvzip[allocation=model])" in capsys.readouterr().err


def test_show_says_where_the_stated_budget_is_not_what_a_longer_context_holds(tmp_path, monkeypatch, capsys):
    from polykv_search.cli import main

    monkeypatch.chdir(tmp_path)
    for name, kind in {**FULL1, **CTX16}.items():
        make(kind, tmp_path / name)
    assert main(["show", "f.json"]) == 0
    assert "note: layers 0 use pattern 'full' with a budget: they keep the whole context" in capsys.readouterr().out
    assert main(["show", "h16.json"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "head groups with budgets above the 16-token context it was built for (up to 120) count as 16" in shown


def test_a_strategy_is_scored_at_the_context_length_it_was_built_for(tmp_path, monkeypatch):
    from polykv_search.cli import main

    monkeypatch.chdir(tmp_path)
    make("strategy-heads-ctx16", tmp_path / "h16.json")
    make("strategy", tmp_path / "s.json")
    (tmp_path / "m").mkdir()  # a model of the strategies' 4 layers and 3 KV heads (its config; no weights)
    shape = {"num_hidden_layers": 4, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    config = {"model_type": "llama", "max_position_embeddings": 8192, "head_dim": 64, **shape}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    score = ["score", "--model", "./m", "--out", "o.json"]
    with pytest.raises(ModelLoaded):  # every check passed
        main([*score, "--strategy", "h16.json", "--context-len", "16", "--suite", "broad"])
    with pytest.raises(ModelLoaded):  # a layer-level strategy holds at most its budgets at any length
        main([*score, "--strategy", "s.json", "--context-len", "4096"])


def test_quickstart_solves_the_head_signal_methods_on_the_head_level_table(tmp_path, monkeypatch):
    from tests.test_quickstart_heads import planned, value

    calls = planned(tmp_path, monkeypatch, "--methods", "proportional,duo,headkv")
    solves = {value(c, "--method"): c for c in calls if c[0] == "solve"}
    heads = str(tmp_path / "qs" / "signals-heads.json")
    assert value(solves["proportional"], "--signals") == str(tmp_path / "qs" / "signals.json")
    for method in ("duo", "headkv"):
        assert value(solves[method], "--signals") == heads and value(solves[method], "--target-context-len") == "512"


def test_ctrl_c_counts_the_samples_the_checkpoint_file_holds(tmp_path):
    """An interrupt between a sample's line reaching the disk and the in-memory count says what a resume finds."""
    from polykv_search.scoring.checkpoint import Checkpoint

    make("partial", tmp_path / "r.json.partial")
    before = snapshot(tmp_path)
    checkpoint = Checkpoint(tmp_path / "r.json.partial", "0123456789abcdef01234567")  # nothing counted in memory
    assert checkpoint.kept() == 1
    assert snapshot(tmp_path) == before


def test_a_full_layer_is_refused_when_its_budget_is_below_the_context_it_was_built_for():
    from strategies import LayerChoice, Strategy, StrategyError

    def built(budget: int) -> Strategy:
        layers = [LayerChoice("full", budget), LayerChoice("snapkv", 8)]
        return Strategy(layers, layers, 16.0, 1, {"solver": "test"}, context_len=16)

    assert built(16).global_budget == 16  # keeps the 16 tokens it counts
    with pytest.raises(StrategyError, match=r"layers\[0\]\.prefill\.budget: pattern 'full' keeps every token"):
        built(8)
