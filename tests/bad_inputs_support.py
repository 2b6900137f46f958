"""Shared set-up of the bad-input tests (tests/test_bad_inputs_*.py): no model, no network, generated input files.

Nothing these tests run may load a model: bad input is refused before one is loaded, and a case that
reaches the loader fails with :class:`ModelLoaded`. Rows that wait for a change in a module the tests
do not own are strict xfails naming the change (:func:`needs`).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
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
            "name": name, "kind": kind, "source": name, "strategy_digest": strategy.digest(),
            "global_budget": strategy.global_budget, "solver": strategy.provenance.get("solver"),
            "strategy": strategy.to_json(), "scores": {t: suites[t.split("/")[0]] for t in tasks},
            "suites": suites, "extra": {}, "kv_bytes": 1e6 * ratio, "full_kv_bytes": 1e6, "kv_ratio": ratio,
            "seconds": 1.0, "tasks": {},
        }  # fmt: skip

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
