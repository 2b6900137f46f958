"""The decode suite's fast path (issue 60): FullKV decoding as a row of the entries' batch, and samples of one
prompt length stepped together, give what today's path gives (FullKV generating alone first, one sample at a
time: ``fullkv_apart``): the same trajectory, agreement, answers and KV bytes; KL and ΔNLL within float
tolerance (rows batched with other rows see 1e-7-level differences, as in tests/test_decode_suite.py)."""

from __future__ import annotations

import pytest
import torch

from polykv_search import scoring
from polykv_search.cli import main
from polykv_search.evaluation import get_task
from polykv_search.runtime import PolyKVCache, apply_strategy, strategy_plans
from polykv_search.runtime.layouts import row_parts
from polykv_search.runtime.row_batch import RowCells
from polykv_search.scoring import per_entry, stacking
from polykv_search.scoring.engine import RunnerSettings, SampleRunner, shared_scorer
from polykv_search.scoring.job import SampleJob
from polykv_search.scoring.shared import SharedScorer
from polykv_search.scoring.trajectories import batch_groups, run_trajectories
from strategies import HeadGroup, LayerChoice, Strategy
from tests.test_decode_suite import KEEP
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.test_scoring_engines import L, entries
from tests.tiny import FAMILIES, tiny_model


def job_at(tok, offset: int, *, prompt: int = 60, n: int = 20, question: bool = False) -> SampleJob:
    ids = tok(haystack_texts()[5][offset : offset + prompt + 20], add_special_tokens=True)["input_ids"][:prompt]
    q = tok(f"\nQ: {offset}? A:", add_special_tokens=False)["input_ids"] if question else []
    return SampleJob("trajectory", ids, q, limit=5 if question else 0, eos=frozenset({2}), generate_len=n)


def scorers(model, es, **kwargs):
    """A context holding the reference scorer (FullKV apart) and the fast one, on the same applied runtime."""
    rt = apply_strategy(model, Strategy.full(L), **kwargs)
    runtime = rt.__enter__()
    plans = [strategy_plans(e.strategy) for e in es]
    return rt, SharedScorer(model, runtime, plans, fullkv_apart=True), SharedScorer(model, runtime, plans)


def assert_same_outcomes(reference, fast, names):
    for name, ref, got in zip(names, reference, fast):
        assert got.kv_bytes == ref.kv_bytes and got.full_kv_bytes == ref.full_kv_bytes, name
        assert got.new_ids == ref.new_ids, name
        for key in ("agree_tokens", "total", "agree"):
            assert got.pred[key] == ref.pred[key], (name, key)
        assert got.pred["agree_buckets"] == ref.pred["agree_buckets"], name
        for key in ("kl", "dnll", "kl_buckets", "dnll_buckets"):
            assert got.pred[key] == pytest.approx(ref.pred[key], rel=1e-3, abs=1e-6), (name, key)


@pytest.mark.parametrize("family,question", list(zip(FAMILIES, [True, False] * 2)))
def test_fullkv_row_and_batched_samples_equal_the_reference_path(family, question):
    """Three samples, two of one prompt length (one batch) and one shorter (a batch of its own), against
    the reference run sample by sample: every entry's outcome, FullKV's trajectory and answers."""
    model, tok = tiny_model(family), char_tokenizer()
    jobs = [job_at(tok, 0, question=question), job_at(tok, 300, question=question)]
    jobs.append(job_at(tok, 600, prompt=48, question=question))
    es = [e for e in entries() if e.name in KEEP]
    rt, reference, fast = scorers(model, es)
    try:
        expected = [reference.run(job) for job in jobs]
        got = fast.run_many(jobs, samples=4)
        alone = fast.run(jobs[2])  # one job: FullKV still a row of the batch
    finally:
        rt.__exit__(None, None, None)
    names = [e.name for e in es]
    for ref, new in zip(expected, got):
        assert_same_outcomes(ref, new, names)
    assert_same_outcomes(expected[2], alone, names)
    assert got[0][0].pred["kl"] == 0.0 and got[0][0].pred["agree"] == 100.0
    assert all(o.pred["kl"] > 0 for o in got[0][1:])  # the evicting entries drift: a test that can fail
    assert (len(got[0][0].new_ids) > 0) == question


def test_decode_interval_and_row_groups_keep_the_batched_path_equal():
    model, tok = tiny_model("llama"), char_tokenizer()
    jobs = [job_at(tok, k * 250, n=18, question=True) for k in range(3)]
    es = [e for e in entries() if e.name in ("full", "uniform-snapkv", "mixed", "decoding-only")]
    rt, reference, fast = scorers(model, es, decode_interval=3)
    try:
        expected = [reference.run(job) for job in jobs]
        got = run_trajectories(fast, jobs)
    finally:
        rt.__exit__(None, None, None)
    for ref, new in zip(expected, got):
        assert_same_outcomes(ref, new, [e.name for e in es])


def test_batch_groups_join_equal_lengths_in_order_up_to_the_size():
    tok = char_tokenizer()
    jobs = [job_at(tok, 0), job_at(tok, 10, prompt=50), job_at(tok, 20), job_at(tok, 30), job_at(tok, 40, n=12)]
    assert batch_groups(jobs, 2) == [[0, 2], [3], [1], [4]]
    assert batch_groups(jobs, 8) == [[0, 2, 3], [1], [4]]
    with pytest.raises(ValueError, match="positive"):
        batch_groups(jobs, 0)
    with pytest.raises(ValueError, match="one prompt length"):
        run_trajectories(None, jobs[:2])


def test_sample_runner_batches_decode_samples_and_keeps_the_records():
    """score_entries' runner: decode_batch samples at a time give the reference runner's rows."""
    model, tok = tiny_model("qwen3"), char_tokenizer(chat=True)
    es = [e for e in entries() if e.name in ("full", "uniform-h2o", "mixed")]
    rows = {}
    for name, settings in {
        "reference": RunnerSettings(decode_batch=1, fullkv_apart=True),
        "fast": RunnerSettings(decode_batch=3),
    }.items():
        out = []
        with SampleRunner(model, tok, es, settings) as runner:
            for task_name in ("decode/trajectory", "decode/recall"):
                task = get_task(task_name, generate_len=12)
                samples = task.generate(tok, haystack_texts(), 3, 300, seed=2)
                pending = [(task, i, s) for i, s in enumerate(samples)]
                chunks = runner.chunks(pending)
                assert [len(c) for c in chunks] == ([1, 1, 1] if name == "reference" else [3])
                for chunk in chunks:
                    out += runner.run_many(task, [s for _, _, s in chunk])
        rows[name] = out
    assert len(rows["fast"]) == 6
    for ref, got in zip(rows["reference"], rows["fast"]):
        for r, g in zip(ref, got):
            a, b = r["record"]["prediction"], g["record"]["prediction"]
            assert b["agree_tokens"] == a["agree_tokens"] and b.get("answer") == a.get("answer")
            assert b["kl"] == pytest.approx(a["kl"], rel=1e-3, abs=1e-6)
            assert g["record"]["kv_bytes"] == r["record"]["kv_bytes"]


def test_score_refuses_a_decode_batch_below_one_before_the_model_loads(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["score", "--model", str(tmp_path / "no-such-model"), "--baseline", "full", "--suite", "decode"]
    assert main([*args, "--decode-batch", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--decode-batch" in err[0] and "positive integer" in err[0]
    assert not out.exists()


def head_group_entries() -> list[scoring.Entry]:
    """DuoAttention-like strategies (the tiny models have 2 KV heads): a streaming head beside a keep-prompt head
    (``evidence[rule=streaming_llm]`` over the prompt, evicting once the generation outgrows it) or a keep-all
    head; the same head sets in another order in the last layer, so rows of both strategies share a split there."""
    stream = {"n_sink": 2}
    prompt = {"rule": "streaming_llm", "share": 0.8}
    keep_prompt = [
        LayerChoice("streaming_llm", 16, stream),
        grouped(((0,), "streaming_llm", 16, stream), ((1,), "evidence", 70, prompt)),
        grouped(((1,), "tova", 20), ((0,), "h2o", 12)),
    ]
    keep_all = [
        grouped(((1,), "full", 4096), ((0,), "streaming_llm", 18, stream)),
        grouped(((0,), "snapkv", 14), ((1,), "full", 4096)),
        grouped(((0,), "knorm", 24), ((1,), "evidence", 30, prompt)),
    ]
    kw = dict(global_budget=None, context_len=4096, num_kv_heads=2)
    return [
        scoring.Entry("full", Strategy.full(L), "baseline", "full"),
        scoring.Entry("keep-prompt", Strategy(keep_prompt, keep_prompt, **kw), "strategy", "p"),
        scoring.Entry("uniform-tova", Strategy.uniform(L, "tova", 20), "baseline", "tova"),
        scoring.Entry("keep-all", Strategy(keep_all, keep_all, **kw), "strategy", "a"),
    ]


def grouped(*groups) -> LayerChoice:
    return LayerChoice.grouped(HeadGroup(*g) for g in groups)


@pytest.mark.parametrize("family,question", list(zip(FAMILIES, [False, True] * 2)))
def test_head_group_rows_of_one_split_share_row_batches_and_equal_the_per_entry_path(family, question, monkeypatch):
    """Three samples (two stepped together) of two head-group strategies beside a layer-level one: the batched
    path, whose rows of one head split share a row batch per head set (``shared_head_groups``), gives each entry
    what it gets alone inside its own ``apply_strategy`` (the per-entry reference), and so does the reference
    of the shared engine (FullKV apart, one sample at a time)."""
    shared = []
    monkeypatch.setattr(stacking, "shared_head_groups", counted_shared_groups(shared))
    model, tok = tiny_model(family), char_tokenizer()
    jobs = [job_at(tok, 0, question=question), job_at(tok, 300, question=question)]
    jobs.append(job_at(tok, 600, prompt=48, question=question))
    es = head_group_entries()
    expected = [per_entry.run_sample(model, es, job) for job in jobs]
    with apply_strategy(model, Strategy.full(L)) as runtime:
        fast, runs = shared_scorer(model, runtime, [e.strategy for e in es])
        apart, _ = shared_scorer(model, runtime, [e.strategy for e in es], fullkv_apart=True)
        assert [i for i, _ in runs] == list(range(len(es)))  # every entry a row of its own
        got = fast.run_many(jobs, samples=4)
        one_at_a_time = [apart.run(job) for job in jobs]
    names = [e.name for e in es]
    for ref, new, alone in zip(expected, got, one_at_a_time):
        assert_same_outcomes(ref, new, names)
        assert_same_outcomes(ref, alone, names)
    assert all(o.pred["kl"] > 0 for o in got[0][1:])  # every evicting entry drifts: a test that can fail
    assert len({tuple(rows) for rows in shared}) > 1 and max(len(rows) for rows in shared) == 4


def counted_shared_groups(seen: list):
    """``shared_head_groups`` appending the rows of every layer it builds to ``seen`` (patched in: which rows were
    shared)."""
    build = stacking.shared_head_groups

    def counted(layer_idx, rows, **kwargs):
        seen.append(list(rows))
        return build(layer_idx, rows, **kwargs)

    return counted


def is_shared_head_groups(layer) -> bool:
    """True for a layer :func:`stacking.shared_head_groups` built: head groups, each a row batch."""
    return all(g.heads is not None and isinstance(g.riders, RowCells) for g in layer.kernel_groups)


def test_a_batch_of_head_group_rows_only_is_one_shared_layer_and_keeps_what_rows_apart_keep():
    """Rows of the two head-group strategies alone, twice each, stepped 30 tokens: a layer both split is one
    ``shared_head_groups`` (every row of one head split); in layer 0, where keep-prompt is layer-level, keep-all's two
    rows share one beside the others' row batch. Every row keeps the positions and gives the logits it does with
    each row's groups in stores of their own (``row_parts``)."""
    model, tok = tiny_model("qwen2"), char_tokenizer()
    job = job_at(tok, 100, n=30)
    es = head_group_entries()
    kept, logits = {}, {}
    with apply_strategy(model, Strategy.full(L)) as runtime:
        scorer, _ = shared_scorer(model, runtime, [es[1].strategy, es[3].strategy])
        for name, layout in (("shared", stacking.stacked_layer), ("apart", row_parts)):
            rows = [scorer._row(plan, groups) for plan, groups in zip(scorer.plans * 2, scorer.head_groups * 2)]
            scorer._context_call(job.context_ids, rows)
            cache = PolyKVCache([layout(l, [r[l] for r in rows], None, **runtime.layer_kwargs(l)) for l in range(L)])
            if name == "shared":
                first, *split = cache.layers
                assert all(is_shared_head_groups(layer) for layer in split)
                batch, shared_rows = first.parts
                assert isinstance(batch.kernel_groups[0].riders, RowCells) and is_shared_head_groups(shared_rows)
            logits[name] = torch.cat([scorer._call([[t]] * len(rows), cache) for t in job.context_ids[:30]], dim=1)
            for layer in cache.layers:
                layer.write_back()
            parts = [[part for row in rows for part in getattr(row[l], "parts", [row[l]])] for l in range(L)]
            kept[name] = [[part.positions for part in layer] for layer in parts]
    torch.testing.assert_close(logits["shared"], logits["apart"], rtol=1e-5, atol=1e-5)
    for shared_layer, apart_layer in zip(kept["shared"], kept["apart"]):
        assert all(torch.equal(a, b) for a, b in zip(shared_layer, apart_layer))
    assert kept["shared"][1][1].shape[-1] == 70  # the keep-prompt head (60 + 30 seen) evicted: a test that can fail
