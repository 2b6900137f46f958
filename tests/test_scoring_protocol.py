"""The two protocols (polykv_search/protocol.py): question-aware compresses the question with the context,
question-agnostic does not; both engines agree under each; results and checkpoints record the protocol
and files of different protocols are never paired."""

from __future__ import annotations

import json

import pytest

from polykv_search import scoring
from polykv_search.cli import main
from polykv_search.evaluation.runner import _Caller
from polykv_search.protocol import AGNOSTIC, AWARE, split_prompt
from polykv_search.runtime import apply_strategy, strategy_plans
from polykv_search.scoring.job import SampleJob
from polykv_search.scoring.shared import SharedScorer
from polykv_search.scoring.task_protocol import protocol_notes
from strategies import Strategy
from tests.test_compare import standard, write
from tests.test_eval_longbench import CHAT_TOK, data_dir  # noqa: F401  (the LongBench jsonl fixture)
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.test_score_cli import checkpoint, score, score_argv  # noqa: F401  (the tiny model fixture)
from tests.test_score_resume import counted, stop_after  # noqa: F401
from tests.test_scoring_engines import L, assert_same, entries, jobs, run_both
from tests.tiny import FAMILIES, tiny_model

B = 24


def aware(job: SampleJob) -> SampleJob:
    context, question = split_prompt(job.context_ids, job.question_ids, AWARE)
    return SampleJob("generate", context, question, limit=job.limit, eos=job.eos)


def run_shared(model, es, job: SampleJob):
    """The shared engine's outcomes alone (``run_both`` without the per-entry reference)."""
    with apply_strategy(model, Strategy.full(L)) as rt:
        return SharedScorer(model, rt, [strategy_plans(e.strategy) for e in es]).run(job)


def prefill_only(pattern: str) -> Strategy:
    return Strategy.from_choices([(pattern, B)] * L, [("full", None)] * L, None)


def kept_per_entry(model, strategy: Strategy, job: SampleJob) -> list[list[set[int]]]:
    """Kept positions per layer and KV head after the prompt calls, through the runtime (per-entry path)."""
    caller = _Caller(model)
    with apply_strategy(model, strategy):
        cache = caller.prefill(job.context_ids).cache
        if job.question_ids:
            cache = caller.extend(job.question_ids, cache).cache
        return [[set(h.tolist()) for h in layer.positions[0]] for layer in cache.layers]


def kept_shared(model, strategy: Strategy, job: SampleJob) -> list[list[set[int]]]:
    """The same through the shared engine's context call, then the question call on the row's stacked cache."""
    with apply_strategy(model, Strategy.full(L)) as rt:
        scorer = SharedScorer(model, rt, [strategy_plans(strategy)])
        row = scorer._row(scorer.plans[0])
        scorer._context_call(job.context_ids, [row])
        if job.question_ids:
            cache = scorer._stacked([row])
            scorer._call([list(job.question_ids)], cache)
            scorer._write_back(cache)
        return [[set(h.tolist()) for h in layer.positions[0]] for layer in row]


def test_every_task_with_a_question_moves_it_into_the_compressed_call(data_dir):  # noqa: F811
    tasks = scoring.resolve_tasks("ruler,broad,longbench/hotpotqa", longbench_source=str(data_dir))
    samples = scoring.make_task_samples(CHAT_TOK, tasks, haystack_texts(), n_samples=1, context_len=3000, seed=0)
    kinds = {}
    for task, (sample,) in samples.values():
        jobs = [scoring.engine.sample_job(CHAT_TOK, task, sample, frozenset(), None, p) for p in (AGNOSTIC, AWARE)]
        agnostic, question_aware = jobs
        if task.kind == "teacher_forced":  # the continuation: no question, the same job
            assert agnostic == question_aware and not agnostic.question_ids
        else:  # the same prompt ids (chat template tail and answer prefix included), all in the first call
            assert agnostic.question_ids and not question_aware.question_ids
            assert question_aware.context_ids == agnostic.context_ids + agnostic.question_ids
            assert CHAT_TOK.decode(question_aware.context_ids).startswith("<s>")
            assert question_aware.limit == agnostic.limit
        kinds[task.name] = task.kind
    assert set(kinds) >= {"ruler/niah_single", "broad/manyshot", "broad/continuation", "longbench/hotpotqa"}
    assert len([k for k in kinds if k.startswith("ruler/")]) == 6


@pytest.mark.parametrize("kept", [kept_per_entry, kept_shared])
def test_the_question_is_compressed_only_under_question_aware(kept):
    model, tok = tiny_model("llama"), char_tokenizer()
    _, gen = jobs(tok)
    n, q = len(gen.context_ids), len(gen.question_ids)
    sinks = set(range(4))  # streaming_llm: 4 sinks + the most recent tokens
    agnostic = kept(model, prefill_only("streaming_llm"), gen)
    assert all(h == sinks | set(range(n - (B - 4), n + q)) for layer in agnostic for h in layer)
    question_aware = kept(model, prefill_only("streaming_llm"), aware(gen))
    assert all(h == sinks | set(range(n + q - (B - 4), n + q)) for layer in question_aware for h in layer)
    # a score-based pattern: the whole prompt competes for the B slots, question tokens included
    agnostic = kept(model, prefill_only("knorm"), gen)
    question_aware = kept(model, prefill_only("knorm"), aware(gen))
    assert all(len(h) == B + q and set(range(n, n + q)) <= h for layer in agnostic for h in layer)
    assert all(len(h) == B for layer in question_aware for h in layer)
    assert any(not set(range(n, n + q)) <= h for layer in question_aware for h in layer)  # some evicted


@pytest.mark.parametrize("family", FAMILIES)
def test_engines_are_equal_under_question_aware(family):
    model, tok = tiny_model(family), char_tokenizer()
    _, gen = jobs(tok)
    job = aware(gen)
    reference, shared = run_both(model, entries(), job)
    assert_same(reference, shared, job)
    assert len({tuple(o.new_ids) for o in shared}) > 1
    agnostic = run_shared(model, entries(), gen)  # its equality to the per-entry path: test_scoring_engines
    assert shared[0].kv_bytes == agnostic[0].kv_bytes  # FullKV holds the same prompt either way
    assert any(a.new_ids != b.new_ids for a, b in zip(shared, agnostic))


def test_score_entries_under_question_aware_on_tasks():
    model, tok = tiny_model("qwen3"), char_tokenizer()
    tasks = scoring.resolve_tasks("broad/continuation,broad/manyshot,ruler/niah_single")
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=2, context_len=300, seed=0)
    es = [e for i, e in enumerate(entries(32)) if i < 6 or e.name == "prefill-only"]
    run = {  # the per-entry path question-agnostic is test_scoring_engines' subject
        (engine, protocol): scoring.score_entries(
            model, tok, es, samples, engine=engine, max_new_tokens=6, protocol=protocol
        )
        for engine, protocol in (("shared", AWARE), ("per-entry", AWARE), ("shared", AGNOSTIC))
    }
    for a, b in zip(run["shared", AWARE], run["per-entry", AWARE]):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
        for task, result in a["tasks"].items():
            assert [r["prediction"] for r in result["per_sample"]] == [
                r["prediction"] for r in b["tasks"][task]["per_sample"]
            ]
    for a, b in zip(run["shared", AWARE], run["shared", AGNOSTIC]):
        # the continuation has no question: the same under both protocols
        same = [[r["prediction"] for r in e["tasks"]["broad/continuation"]["per_sample"]] for e in (a, b)]
        assert same[0] == same[1] and a["scores"]["broad/continuation"] == b["scores"]["broad/continuation"]
        for task in ("broad/manyshot", "ruler/niah_single"):  # the whole prompt is the compressed call
            for ra, rb in zip(a["tasks"][task]["per_sample"], b["tasks"][task]["per_sample"]):
                assert rb["question_tokens"] > 0 and ra["question_tokens"] == 0
                assert ra["context_tokens"] == rb["context_tokens"] + rb["question_tokens"]
    full_a, full_b = run["shared", AWARE][0], run["shared", AGNOSTIC][0]
    assert full_a["kv_bytes"] == full_b["kv_bytes"]
    # prefill snapkv, decoding FullKV: the question's tokens were compressed too, so fewer remain
    assert run["shared", AWARE][-1]["kv_bytes"] < run["shared", AGNOSTIC][-1]["kv_bytes"]


def test_bad_protocols_and_the_decode_suite_are_refused():
    model, tok = tiny_model("llama"), char_tokenizer()
    with pytest.raises(scoring.ScoreError, match="unknown protocol 'both'"):
        scoring.score_entries(model, tok, entries()[:1], {}, protocol="both")
    (task,) = scoring.resolve_tasks("decode/recall")
    with pytest.raises(scoring.ScoreError, match="decode suite has no question"):
        scoring.score_entries(model, tok, entries()[:1], {task.name: (task, [])}, protocol=AWARE)
    with pytest.raises(ValueError, match="unknown protocol"):
        split_prompt([1], [2], "aware")


# ------------------------------------------------------------------------------------------- CLI
def test_results_record_the_protocol_and_both_engines_agree(checkpoint, tmp_path):  # noqa: F811
    default = score(checkpoint, tmp_path / "default.json")
    shared = score(checkpoint, tmp_path / "aware.json", "--question-aware")
    per = score(checkpoint, tmp_path / "per.json", "--question-aware", "--no-shared-prefill")
    assert default["provenance"]["protocol"] == AGNOSTIC
    assert shared["provenance"]["protocol"] == per["provenance"]["protocol"] == AWARE
    for a, b in zip(shared["entries"], per["entries"]):
        assert a["scores"] == b["scores"] and a["kv_bytes"] == b["kv_bytes"]
    for a, b in zip(shared["entries"], default["entries"]):  # one compressed prompt call, no question call
        ra, rb = (e["tasks"]["ruler/niah_single"]["per_sample"] for e in (a, b))
        assert [r["context_tokens"] for r in ra] == [r["context_tokens"] + r["question_tokens"] for r in rb]
        assert all(r["question_tokens"] == 0 for r in ra) and all(r["question_tokens"] > 0 for r in rb)


def test_question_aware_manyshot_scores_every_entry_as_fullkv_and_says_so(checkpoint, tmp_path, capsys):  # noqa: F811
    # the label's first token is predicted by the prompt call, whose attention runs before any eviction
    argv = score_argv(checkpoint, tmp_path / "m.json", "--question-aware")
    argv[argv.index("--suite") + 1] = "broad/manyshot"
    assert main(argv) == 0
    assert "note: broad/manyshot under --question-aware" in "".join(capsys.readouterr())
    entries = {
        e["name"]: e["tasks"]["broad/manyshot"]["per_sample"]
        for e in json.loads((tmp_path / "m.json").read_text())["entries"]
    }
    full = entries.pop("full")
    for name, records in entries.items():  # the tiny model's tokenizer is one token per character
        assert [r["prediction"][:1] for r in records] == [r["prediction"][:1] for r in full], name
        assert [r["score"] for r in records] == [r["score"] for r in full], name
    # from the second token on, eviction acts: the answers differ
    assert any(r["prediction"] != f["prediction"] for records in entries.values() for r, f in zip(records, full))
    assert protocol_notes([scoring.resolve_tasks("broad/manyshot")[0]], AGNOSTIC) == []


def test_the_decode_suite_under_question_aware_is_one_line_exit_2(checkpoint, tmp_path, capsys):  # noqa: F811
    argv = score_argv(checkpoint, tmp_path / "r.json", "--question-aware")
    argv[argv.index("--suite") + 1] = "decode"
    argv[argv.index("--model") + 1] = str(tmp_path / "no-such-model")  # refused before the model loads
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decode suite has no question" in err[0] and "--question-aware" in err[0]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("first, then", [((), ("--question-aware",)), (("--question-aware",), ())])
def test_a_checkpoint_of_the_other_protocol_is_not_resumed(checkpoint, tmp_path, counted, capsys, first, then):  # noqa: F811
    out = tmp_path / "r.json"
    stop_after(checkpoint, out, counted, 2, *first)
    header = json.loads((tmp_path / "r.json.partial").read_text().splitlines()[0])
    assert header.get("protocol", AGNOSTIC) == (AWARE if first else AGNOSTIC)
    before = (tmp_path / "r.json.partial").read_text()
    capsys.readouterr()
    assert main(score_argv(checkpoint, out, *then)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    was, now = (AWARE, AGNOSTIC) if first else (AGNOSTIC, AWARE)
    assert len(err) == 1 and f"the {was} protocol, this run is {now}" in err[0] and "r.json.partial" in err[0]
    assert not out.exists() and (tmp_path / "r.json.partial").read_text() == before
    resumed = score(checkpoint, out, *first)  # the same protocol resumes
    assert resumed["provenance"]["protocol"] == (AWARE if first else AGNOSTIC) and counted["runs"] == 6 - 2


def test_a_checkpoint_header_with_a_bad_protocol_is_refused(tmp_path):
    from polykv_search.scoring.checkpoint import Checkpoint

    path = tmp_path / "p"
    path.write_text(json.dumps({"key": "k", "protocol": "sometimes"}) + "\n")
    with pytest.raises(scoring.ScoreError, match="line 1: protocol must be one of"):
        Checkpoint.open(path, "k")


def test_compare_refuses_to_pair_protocols_with_one_line_exit_2(tmp_path, capsys):
    legacy = standard(64)  # written before protocols: question-agnostic
    explicit = standard(64)
    explicit["provenance"]["protocol"] = AGNOSTIC
    question_aware = standard(64)
    question_aware["provenance"]["protocol"] = AWARE
    a, b, c = (
        write(tmp_path, name, d) for name, d in [("a.json", legacy), ("b.json", explicit), ("c.json", question_aware)]
    )
    assert main(["compare", a, b]) == 0
    capsys.readouterr()
    for extra in ([], ["--allow-mismatch"], ["--across-budgets"]):
        assert main(["compare", a, c, *extra, "--json", str(tmp_path / "out.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and a in err[0] and c in err[0]
        assert f"is {AGNOSTIC}" in err[0] and f"is {AWARE}" in err[0] and "never paired" in err[0]
    assert not (tmp_path / "out.json").exists()
    assert main(["compare", c]) == 0 and AWARE in capsys.readouterr().out
    question_aware["provenance"]["protocol"] = "aware"
    bad = write(tmp_path, "bad.json", question_aware)
    assert main(["compare", bad]) == 2
    assert "provenance.protocol" in capsys.readouterr().err
