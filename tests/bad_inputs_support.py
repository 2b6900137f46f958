"""Shared set-up of the bad-input tests (tests/test_bad_inputs_*.py): no model, no network, generated input files.

Nothing these tests run may load a model: bad input is refused before one is loaded, and a case that
reaches the loader fails with :class:`ModelLoaded`. Rows that wait for a change in a module the tests
do not own are strict xfails naming the change (:func:`needs`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from strategies import Strategy

L = 4


class ModelLoaded(BaseException):
    """Raised where a model would be loaded: bad input must be refused before that."""


@pytest.fixture(autouse=True)
def no_model_no_network(monkeypatch):
    import huggingface_hub
    import transformers

    def loading(*args, **kwargs):
        raise ModelLoaded("bad input reached model loading")

    def no_network(self, repo_id, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(auto, "from_pretrained", loading)
    monkeypatch.setattr("polykv_search.models._gguf_checkpoint", loading)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_network)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)


#: seconds a bad-input test may run: a hang fails the test instead of the CI run (generous: 2 shared cores)
TIME_LIMIT = 60


class Hung(BaseException):
    """Raised into a test that ran past :data:`TIME_LIMIT` (a BaseException: no ``except Exception`` eats it)."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise :class:`Hung` into the block if it runs past ``seconds`` (SIGALRM; POSIX main thread only).

    Nests: an outer deadline's timer is restored, less the time the block took."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def hung(signum, frame):
        raise Hung(f"still running after {seconds:g} s: a hang")

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, hung)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


@pytest.fixture(autouse=True)
def time_limit():
    """Fail a test that runs past :data:`TIME_LIMIT` seconds."""
    with deadline(TIME_LIMIT):
        yield


# --------------------------------------------------------------------------------------------
# Generated input files


def strategy_doc() -> dict:
    prefill = [("streaming_llm", 96), ("snapkv", 80), ("h2o", 48), ("tova", 32)]
    return Strategy.from_choices(prefill, [("tova", 64)] * L, 64.0, solver="test").to_json()


def signals_doc() -> dict:
    from signals.synthetic import random_signal_table

    return random_signal_table(num_layers=L, patterns=("snapkv", "tova"), budgets=(32, 64), seed=1).to_json()


def results_doc() -> dict:
    tasks = {"ruler/niah_single": "aaaa", "broad/continuation": "bbbb"}

    def entry(name: str, strategy: Strategy, kind: str, suites: dict[str, float]) -> dict:
        ratio = 1.0 if strategy.is_full else 0.125
        return {
            "name": name,
            "kind": kind,
            "source": name,
            "strategy_digest": strategy.digest(),
            "global_budget": strategy.global_budget,
            "solver": strategy.provenance.get("solver"),
            "strategy": strategy.to_json(),
            "scores": {t: suites[t.split("/")[0]] for t in tasks},
            "suites": suites,
            "extra": {},
            "kv_bytes": 1e6 * ratio,
            "full_kv_bytes": 1e6,
            "kv_ratio": ratio,
            "seconds": 1.0,
            "tasks": {},
        }

    entries = [
        entry("full", Strategy.full(L), "baseline", {"ruler": 80.0, "broad": 90.0}),
        entry("uniform-snapkv", Strategy.uniform(L, "snapkv", 64), "baseline", {"ruler": 40.0, "broad": 70.0}),
        entry("proportional", Strategy.from_json(strategy_doc()), "strategy", {"ruler": 65.0, "broad": 75.0}),
    ]
    return {
        "schema": "polykv-results",
        "version": 1,
        "provenance": {
            "model": "tiny",
            "model_fingerprint": "m1",
            "settings": {"budget": 64, "samples": 2, "context_len": 512, "seed": 0, "decode_interval": 1},
            "tasks": {t: {"version": "1", "suite": t.split("/")[0], "samples": fp} for t, fp in tasks.items()},
        },
        "entries": entries,
    }


def _with(doc_fn, path: str, value) -> str:
    """The JSON of ``doc_fn()`` with the value at ``path`` (``a.0.b``) replaced; NaN written as NaN."""
    doc = doc_fn()
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return json.dumps(doc)


def signals_v1_doc() -> dict:
    """A version-1 signal table: no KL signal, no standard errors."""
    doc = signals_doc()
    doc.pop("kl"), doc.pop("uncertainty")
    return {**doc, "version": 1}


def partial_row(task: str = "ruler/niah_single", index: int = 0, entries: int = 1) -> dict:
    """One finished sample of a score checkpoint (``<out>.partial``), as the score engine writes it."""
    record = {
        "id": f"{task}:0:{index}",
        "prediction": "1234",
        "answers": ["1234"],
        "score": 100.0,
        "context_tokens": 10,
        "question_tokens": 5,
        "new_tokens": 3,
        "context_s": 0.1,
        "question_s": 0.0,
        "decode_s": 0.1,
        "kv_bytes": 100,
        "full_kv_bytes": 400,
    }
    return {
        "task": task,
        "index": index,
        "sample": record["id"],
        "wall": 0.2,
        "rows": [{"record": dict(record), "seconds": 0.0} for _ in range(entries)],
    }


def partial_text(*rows, head=None) -> str:
    lines = [json.dumps({"key": "0123456789abcdef01234567"} if head is None else head)]
    return "\n".join(lines + [r if isinstance(r, str) else json.dumps(r) for r in rows]) + "\n"


def _row_without(*path: str) -> dict:
    row = partial_row()
    node = row
    for key in path[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    del node[path[-1]]
    return row


def full_budget_1_doc() -> dict:
    """A layer-level strategy (no context_len) whose first layer is pattern 'full' with budget 1: B counts 1 token
    where the layer keeps the whole context."""
    prefill = [("full", 1), ("snapkv", 16), ("h2o", 16), ("tova", 16)]
    return Strategy.from_choices(prefill, prefill, 16.0, solver="test").to_json()


def heads_ctx16_doc(full_budget: int = 16) -> dict:
    """A head-level strategy declaring context_len 16 whose groups keep 120 tokens (and one keep-all head at
    ``full_budget``): B counts every head at most at 16 tokens."""
    from strategies import LayerChoice
    from strategies.head_groups import HeadGroup

    g = LayerChoice.grouped([HeadGroup((0,), "full", full_budget), HeadGroup((1, 2), "streaming_llm", 120)])
    layers = [g] * L
    return Strategy(layers, layers, 16.0, 1, {"solver": "test"}, context_len=16, num_kv_heads=3).to_json()


def head_cells_table(kvzip: bool = False):
    """A head-level signal table as the quickstart collects it: one layer-level cell (snapkv at 32, prefill,
    layer 0 only) and per-KV-head retrieval scores and cells (streaming_llm, h2o, with ``kvzip`` kvzip's pool)."""
    import numpy as np

    from signals import SignalTable
    from signals.head_prefill_cells import PrefillCells
    from signals.head_signals import HeadCells, HeadSignals
    from tests.head_tables import random_heads

    rng = np.random.default_rng(0)

    def arrays():
        nan = np.full((L, 3, 2), np.nan)
        return rng.uniform(0.1, 1, (L, 3, 2)), nan, rng.uniform(0, 0.1, (L, 3, 2)), nan

    base = random_heads(L, 3, context_len=256)
    scored = [PrefillCells("h2o", (16, 32), *arrays())]
    if kvzip:
        scored.append(PrefillCells("kvzip", (16, 32), *arrays(), params={"allocation": "model"}))
    table = SignalTable.empty(L, ["prefill"], ["snapkv"], [32], {"model": "tiny"})
    table.set_heads(HeadSignals(base.retrieval, base.provenance, HeadCells(4, (16, 32), *arrays()), tuple(scored)))
    return table


#: a model folder whose config claims a huge context and shape: its KV cache at long contexts fits no machine
HUGE_CONFIG = {
    "model_type": "llama",
    "max_position_embeddings": 10**9,
    "num_hidden_layers": 100,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "head_dim": 128,
    "hidden_size": 8192,
}

#: a model folder whose config states no window or shape: only the stated ceilings bound its lengths
BARE_CONFIG = {"model_type": "llama"}

LATIN1 = "Caf\xe9 au lait, na\xefve r\xe9sum\xe9 \xe0 la carte".encode("latin-1")

FILES = {
    "strategy": lambda: json.dumps(strategy_doc()),
    "signals": lambda: json.dumps(signals_doc()),
    "results": lambda: json.dumps(results_doc()),
    "latin1": lambda: LATIN1,
    "not-json": lambda: "{this is not json",
    "json-array": lambda: "[1, 2, 3]",
    "unknown-schema": lambda: '{"schema": "something-else", "version": 1}',
    "truncated-strategy": lambda: json.dumps(strategy_doc())[:300],
    "strategy-nan-budget": lambda: _with(strategy_doc, "global_budget", math.nan),
    "strategy-inf-param": lambda: _with(strategy_doc, "layers.1.prefill.params", {"window": math.inf}),
    "strategy-nan-provenance": lambda: _with(strategy_doc, "provenance.score", math.nan),
    "signals-nan-cell": lambda: _with(signals_doc, "cosine.0.0.0.0", math.nan),
    "results-string-score": lambda: _with(results_doc, "entries.2.suites.ruler", "high"),
    "results-nan-score": lambda: _with(results_doc, "entries.2.suites.ruler", math.nan),
    "prose": lambda: "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 20,
    "empty": lambda: "",
    "signals-v1": lambda: json.dumps(signals_v1_doc()),
    # score checkpoints (``<out>.partial``) of a run with one entry
    "partial": lambda: partial_text(partial_row()),
    "partial-list-head": lambda: partial_text(partial_row(), head=[1, 2]),
    "partial-no-index": lambda: partial_text(_row_without("index")),
    "partial-empty-rows": lambda: partial_text({**partial_row(), "rows": []}),
    "partial-no-prediction": lambda: partial_text(_row_without("rows", "0", "record", "prediction")),
    "partial-nan-wall": lambda: partial_text(json.dumps(partial_row()).replace('"wall": 0.2', '"wall": NaN')),
    "partial-garbage-line": lambda: partial_text("{not json", partial_row()),
    "partial-unknown-task": lambda: partial_text(partial_row(task="ruler/nosuch")),
    "partial-twice": lambda: partial_text(partial_row(), partial_row()),
    "partial-latin1": lambda: LATIN1,
    # issue 62: budgets that misstate the memory held, a head-cells table, a model config without weights
    "strategy-full-budget-1": lambda: json.dumps(full_budget_1_doc()),
    "strategy-heads-ctx16": lambda: json.dumps(heads_ctx16_doc()),
    "strategy-heads-full-1": lambda: json.dumps(heads_ctx16_doc()).replace('"budget": 16,', '"budget": 1,', 1),
    "signals-heads": lambda: head_cells_table().dumps(),
    "signals-kvzip-cells": lambda: head_cells_table(kvzip=True).dumps(),
    "model-config-huge": lambda: json.dumps(HUGE_CONFIG),
    "model-config-bare": lambda: json.dumps(BARE_CONFIG),
}


def make(kind: str, path: Path) -> None:
    if kind == "dir":
        path.mkdir(parents=True)
        return
    data = FILES[kind]()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a hash of its bytes (``dir`` for folders)."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def needs(owner: str, what: str):
    return pytest.mark.xfail(strict=True, reason=f"needs {owner}: {what}")


def row(argv: str, match: str, files: dict[str, str] | None = None, *, id: str, marks=()):
    return pytest.param(argv, match, files or {}, id=id, marks=marks)


S, SIG, RES = {"s.json": "strategy"}, {"sig.json": "signals"}, {"r.json": "results"}
LINUX = sys.platform.startswith("linux")
READ_ONLY = "/proc/polykv-bad-input/out.json"  # /proc refuses new files, even to root
ro = pytest.mark.skipif(not LINUX, reason="needs /proc")


def run_case(argv: str, match: str, files: dict[str, str], tmp_path: Path, monkeypatch, capsys) -> None:
    """Run one corpus row: exit code 2, one ``error:`` line holding ``match``, no traceback, nothing written."""
    import shlex

    from polykv_search.cli import main

    monkeypatch.chdir(tmp_path)
    for name, kind in files.items():
        make(kind, tmp_path / name)
    before = snapshot(tmp_path)
    rc = main(shlex.split(argv.format(tmp=tmp_path)))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert match.lower() in err.lower(), err
    assert snapshot(tmp_path) == before  # no output, no half-written file, no stray .tmp
