"""The decode suite: FullKV's own generation teacher-forced step by step, where decoding-phase eviction
decides. Shared engine == per-entry reference on every tiny family; forcing an entry along its own
generation reproduces it exactly (eviction as in generation); compare shows per-bucket KL and the drift."""

from __future__ import annotations

import json

import pytest
import torch

from polykv_search import compare as cmp
from polykv_search import scoring
from polykv_search.cli import main
from polykv_search.evaluation import get_task, list_tasks, trajectory
from polykv_search.evaluation.runner import _Caller, greedy_generate, run_task
from polykv_search.evaluation.trajectory import Trajectory, buckets, forced_run, full_trajectory
from polykv_search.runtime import apply_strategy
from polykv_search.scoring import per_entry
from polykv_search.scoring.job import SampleJob
from strategies import Strategy
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.test_scoring_engines import entries, run_both
from tests.tiny import FAMILIES, tiny_model

L = 3
#: a few entries that cover every phase mix, eviction through key norms (knorm) and through attention
KEEP = ("full", "uniform-h2o", "uniform-tova", "uniform-knorm", "mixed", "prefill-only", "decoding-only")


def some_entries(budget: int = 24) -> list[scoring.Entry]:
    return [e for e in entries(budget) if e.name in KEEP]


def trajectory_job(tok, *, n: int = 40, question: bool = False, prompt: int = 70) -> SampleJob:
    ids = tok(haystack_texts()[5][: prompt + 20], add_special_tokens=True)["input_ids"]
    q = tok("\nQ: what? A:", add_special_tokens=False)["input_ids"] if question else []
    return SampleJob("trajectory", ids[:prompt], q, limit=6 if question else 0, eos=frozenset({2}), generate_len=n)


def test_decode_tasks_are_registered_deterministic_and_checked():
    names = [t["name"] for t in list_tasks("decode") if t["default"]]
    assert names == ["decode/trajectory", "decode/recall"]  # the recall variants: tests/test_decode_recall.py
    assert get_task("decode/trajectory").generate_len == 512
    assert get_task("decode/recall", generate_len=64).generate_len == 64
    for chat in (False, True):
        tok = char_tokenizer(chat=chat)
        for name in names:
            task = get_task(name, generate_len=32)
            a = task.generate(tok, haystack_texts(), 3, 300, seed=4)
            b = task.generate(tok, haystack_texts(), 3, 300, seed=4)
            assert [s.to_dict() for s in a] == [s.to_dict() for s in b]
            assert all(s.meta["generate_len"] == 32 and 280 <= len(s.context_ids) <= 300 for s in a)
            assert len({tuple(s.context_ids) for s in a}) == 3
    recall = get_task("decode/recall").generate(char_tokenizer(chat=True), haystack_texts(), 2, 300, seed=0)
    for s in recall:
        text = char_tokenizer().decode(s.context_ids)
        assert f"The secret number of {s.meta['asked']} is {s.answers[0]}." in text
        assert s.question.endswith(s.answer_prefix) and "<|user|>" in s.question
    with pytest.raises(ValueError, match="generate_len"):
        get_task("decode/trajectory", generate_len=1)
    with pytest.raises(ValueError, match="too short"):
        get_task("decode/recall").generate(char_tokenizer(), haystack_texts(), 1, 50, seed=0)


def test_buckets_cover_the_trajectory():
    assert buckets(300) == [("0-128", 0, 128), ("128-256", 128, 256), ("256-300", 256, 300)]
    assert buckets(128) == [("0-128", 0, 128)]


@pytest.mark.parametrize("family,question", list(zip(FAMILIES, [False, True] * 2)))
def test_shared_engine_equals_per_entry_path_on_trajectories(family, question):
    """Same agreement, answers and KV bytes; KL within float tolerance (batched rows see 1e-7-level
    differences in their keys, enough to flip a near tie of knorm's key norms once in a while)."""
    model, tok = tiny_model(family), char_tokenizer()
    job = trajectory_job(tok, n=24, question=question)
    es = entries()
    reference, shared = run_both(model, es, job)
    for e, ref, got in zip(es, reference, shared):
        assert got.kv_bytes == ref.kv_bytes and got.full_kv_bytes == ref.full_kv_bytes, e.name
        assert got.pred["agree_tokens"] == ref.pred["agree_tokens"] and got.pred["total"] == job.generate_len
        assert got.pred["kl"] == pytest.approx(ref.pred["kl"], rel=1e-3, abs=1e-7)
        assert got.pred["dnll"] == pytest.approx(ref.pred["dnll"], rel=1e-3, abs=1e-6)
        assert got.pred["kl_buckets"] == pytest.approx(ref.pred["kl_buckets"], rel=1e-3, abs=1e-7)
        assert got.new_ids == ref.new_ids and (len(got.new_ids) > 0) == question
    assert shared[0].pred["kl"] == 0.0 and shared[0].pred["agree"] == 100.0
    # here, unlike a one-call continuation, a decoding-only strategy drifts: its plan evicts step by step
    assert all(o.pred["kl"] > 0 for o in shared[1:])
    assert len({o.pred["agree_tokens"] for o in shared}) > 2


def test_batching_and_decode_interval_do_not_change_trajectory_results():
    model, tok = tiny_model("llama"), char_tokenizer()
    job = trajectory_job(tok, n=16, question=True)
    es = some_entries()[:4]
    reference, batched = run_both(model, es, job, batch_entries=3, decode_interval=3)
    for ref, got in zip(reference, batched):
        assert got.pred["agree_tokens"] == ref.pred["agree_tokens"] and got.new_ids == ref.new_ids
        assert got.pred["kl"] == pytest.approx(ref.pred["kl"], rel=1e-3, abs=1e-7)


@pytest.mark.parametrize("name", ["decoding-only", "mixed"])
def test_forcing_an_entry_along_its_own_generation_reproduces_it(name):
    """Teacher forcing evicts exactly as generation does: along its own greedy tokens, an entry agrees
    with itself at every position and keeps the same tokens."""
    model, tok = tiny_model("qwen2"), char_tokenizer()
    job = trajectory_job(tok, n=36)
    strategy = next(e.strategy for e in entries() if e.name == name)
    caller = _Caller(model)
    with apply_strategy(model, strategy) as rt:
        own, _ = greedy_generate(model, job.context_ids, [], job.generate_len, frozenset(), caller)
        generated = [layer.positions.clone() for layer in rt.last_cache.layers]
    assert len(own) == job.generate_len
    fake = Trajectory(own, torch.zeros(len(own), model.config.vocab_size), [], None, {})
    with apply_strategy(model, strategy) as rt:
        pred, _, _ = forced_run(caller, fake, job.context_ids, frozenset())
        forced = [layer.positions for layer in rt.last_cache.layers]
    assert pred["agree"] == 100.0
    # both feed the first n-1 tokens one per call: every layer keeps the same positions
    assert all(torch.equal(f, g) for f, g in zip(forced, generated))


def test_full_trajectory_bans_eos_and_runner_matches_fullkv():
    model, tok = tiny_model("mistral"), char_tokenizer()
    job = trajectory_job(tok, n=30)
    caller = _Caller(model)
    free = full_trajectory(caller, job.context_ids, 30, frozenset())
    common = max(set(free.tokens), key=free.tokens.count)
    banned = full_trajectory(caller, job.context_ids, 30, frozenset({common}))
    assert common in free.tokens and common not in banned.tokens and len(banned.tokens) == 30
    assert banned.logits.shape == (30, model.config.vocab_size)
    task = get_task("decode/trajectory", generate_len=20)
    samples = task.generate(tok, haystack_texts(), 2, 100, seed=1)
    plain = run_task(model, tok, task, samples)
    assert plain.score == 100.0 and plain.extra["kl"] == 0.0
    squeezed = run_task(model, tok, task, samples, runner=lambda: apply_strategy(model, Strategy.uniform(L, "h2o", 12)))
    assert squeezed.score < 100.0 and squeezed.extra["kl"] > 0
    assert set(squeezed.per_sample[0]["kl_buckets"]) == {"0-20"}


@pytest.fixture(scope="module")
def decode_results():
    patch = pytest.MonkeyPatch()
    patch.setattr(trajectory, "BUCKET", 16)  # two buckets on a short trajectory
    model, tok = tiny_model("qwen3"), char_tokenizer(chat=True)
    tasks = scoring.resolve_tasks("decode", generate_len=20)
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=260, seed=0)
    es = entries(24)[:3] + entries(24)[-2:-1]  # full, two uniforms, decoding-only
    shared = scoring.score_entries(model, tok, es, samples, engine="shared")
    per = scoring.score_entries(model, tok, es, samples, engine="per-entry")
    doc = scoring.results_document(
        shared, model_name="tiny", model_fp="fp", task_samples=samples, settings={"budget": 24}, split={}
    )
    patch.undo()
    return shared, per, doc


@pytest.mark.xdist_group("decode_results")  # one worker computes the module fixture once
def test_score_entries_shared_equals_per_entry_on_the_decode_suite(decode_results):
    shared, per, _ = decode_results
    for a, b in zip(shared, per):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
        for task in ("decode/trajectory", "decode/recall"):
            for ra, rb in zip(a["tasks"][task]["per_sample"], b["tasks"][task]["per_sample"]):
                assert ra["prediction"].get("answer") == rb["prediction"].get("answer")
                assert ra["kl_buckets"] == pytest.approx(rb["kl_buckets"], rel=1e-3, abs=1e-7)
                assert set(ra["kl_buckets"]) == {"0-16", "16-20"}
        assert ("answer" in a["tasks"]["decode/recall"]["per_sample"][0]["prediction"]) and (
            "answer" not in a["tasks"]["decode/trajectory"]["per_sample"][0]["prediction"]
        )
    assert shared[0]["scores"]["decode/trajectory"] == 100.0


@pytest.mark.xdist_group("decode_results")  # one worker computes the module fixture once
def test_compare_shows_kl_per_bucket_and_draws_the_drift(decode_results, tmp_path):
    _, _, doc = decode_results
    c = cmp.compare([doc])
    assert c.bucket_suites == {"decode": ["0-16", "16-20"]}
    decoding_only = next(r for r in c.rows if r.name == "decoding-only")
    iv = decoding_only.kl_buckets["decode"]["0-16"]
    assert iv.estimate > 0 and iv.low <= iv.estimate <= iv.high
    keys = [col.key for col in cmp.columns(c, details=True)]
    assert "klb:decode@0-16" in keys and "klb:decode@16-20" in keys
    assert not any(k.startswith("klb") for k in (col.key for col in cmp.columns(c, details=False)))
    assert "KL decode 0-16" in cmp.to_markdown(c)
    assert cmp.plot(c, tmp_path / "drift.png").read_bytes()[:4] == b"\x89PNG"
    assert c.to_json()["rows"][1]["fidelity"]["kl_buckets"]["decode"]["0-16"]["estimate"] >= 0
    bad = json.loads(json.dumps(doc))
    bad["entries"][1]["tasks"]["decode/trajectory"]["per_sample"][0]["kl_buckets"]["0-16"] = "x"
    with pytest.raises(cmp.CompareError, match="kl_buckets"):
        cmp.compare([bad])


def test_list_tasks_shows_the_decode_suite(capsys):
    assert main(["score", "--list-tasks"]) == 0
    shown = capsys.readouterr().out
    assert "decode/trajectory" in shown and "decode/recall" in shown


def test_per_entry_run_sample_without_fidelity_flag_still_runs_trajectories():
    model, tok = tiny_model("llama"), char_tokenizer()
    out = per_entry.run_sample(model, entries()[:2], trajectory_job(tok, n=10), fidelity=False)
    assert out[0].pred["kl"] == 0.0 and out[1].pred["total"] == 10


def test_score_and_compare_cli_on_the_decode_suite(tmp_path, capsys):
    ckpt = tmp_path / "tiny"
    tiny_model("llama", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(haystack_texts()[:40])))
    out = tmp_path / "decode.json"
    argv = [
        "score",
        "--model",
        str(ckpt),
        "--corpus",
        str(corpus),
        "--baseline",
        "full",
        "--baseline",
        "uniform:h2o",
        "--budget",
        "16",
        "--suite",
        "decode",
        "--samples",
        "2",
        "--context-len",
        "260",
        "--generate-len",
        "12",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["provenance"]["settings"]["generate_len"] == 12
    assert doc["provenance"]["settings"]["decode_batch"] == 8  # --decode-batch's default, recorded as provenance
    record = doc["entries"][1]["tasks"]["decode/trajectory"]["per_sample"][0]
    assert record["prediction"]["total"] == 12 and set(record["kl_buckets"]) == {"0-12"}
    capsys.readouterr()
    assert main(["compare", str(out), "--details", "--plot", str(tmp_path / "drift.png")]) == 0
    shown = capsys.readouterr().out
    assert "KL decode" in shown and "0-12" in shown
    assert (tmp_path / "drift.png").read_bytes()[:4] == b"\x89PNG"


def test_list_tasks_fits_an_80_column_terminal(monkeypatch):
    """Every task name whole on one line, its description and metric wrapped beside it, no line past 80."""
    from rich.console import Console

    from polykv_search.cli import score as score_cli

    console = Console(width=80, record=True, color_system=None)
    monkeypatch.setattr(score_cli, "out", console)
    assert main(["score", "--list-tasks"]) == 0
    shown = console.export_text()
    assert max(len(line) for line in shown.splitlines()) <= 80
    lines = shown.splitlines()
    for row in list_tasks():
        assert any(line.startswith(f"│ {row['name']} ") for line in lines), row["name"]
    assert shown.count("metric: ") == len(list_tasks())
