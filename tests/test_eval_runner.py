"""The runner: plain HF calls (context call, question call, greedy steps) on a tiny random Llama."""

from __future__ import annotations

import contextlib

import pytest
import torch

from polykv_search.evaluation import (
    Sample,
    get_task,
    greedy_generate,
    list_tasks,
    run_task,
    suite_scores,
    tasks_for,
    teacher_forced,
)
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.tiny import tiny_model

TEXTS = haystack_texts()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer(chat=True)


def reference_greedy(model, ids, n):
    """Greedy decoding by recomputing the whole sequence every step (no cache)."""
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            ids.append(nxt)
    return out


def test_context_then_question_then_greedy_steps_equals_uncached_greedy(model):
    context, question = list(range(4, 60)), list(range(60, 70))
    new, timing = greedy_generate(model, context, question, 6)
    assert new == reference_greedy(model, context + question, 6)
    assert set(timing) == {"context_s", "question_s", "decode_s"}


def test_generation_stops_at_eos(model):
    context = list(range(4, 40))
    first = reference_greedy(model, context, 1)[0]
    new, _ = greedy_generate(model, context, [], 5, eos_ids={first})
    assert new == []


def test_teacher_forcing_scores_the_continuation_like_one_full_forward(model):
    context, target = list(range(4, 50)), [7, 8, 9, 10, 11]
    pred, _ = teacher_forced(model, context, target)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + target]), use_cache=False).logits[0, len(context) - 1 : -1]
    logp = torch.log_softmax(logits, -1)
    assert pred["total"] == 5
    assert pred["correct"] == int((logits.argmax(-1) == torch.tensor(target)).sum())
    assert pred["nll"] == pytest.approx(float(-logp[torch.arange(5), target].sum()), rel=1e-4)


@pytest.mark.parametrize("name", ["ruler/niah_single", "broad/manyshot", "broad/continuation"])
def test_run_task_end_to_end_returns_a_score_in_0_100(model, tok, name):
    task = get_task(name, **({"continuation_len": 8} if name == "broad/continuation" else {}))
    samples = task.generate(tok, TEXTS, 2, 400, seed=0)
    result = run_task(model, tok, task, samples, max_new_tokens=4)
    assert 0.0 <= result.score <= 100.0
    assert result.n_samples == 2 and len(result.predictions) == 2 and len(result.per_sample) == 2
    assert result.task == name and result.suite == task.suite
    assert result.timing["total_s"] > 0 and result.meta["samples_fingerprint"]
    for record in result.per_sample:
        assert record["context_tokens"] + record["question_tokens"] <= 400
        assert 0.0 <= record["score"] <= 100.0
    if task.kind == "teacher_forced":
        assert result.extra["ppl"] > 1.0
    else:
        assert all(isinstance(p, str) for p in result.predictions)
        assert all(r["new_tokens"] <= 4 for r in result.per_sample)


def test_the_runner_context_wraps_every_sample_and_sees_each_record(model, tok):
    task = get_task("ruler/niah_single")
    samples = task.generate(tok, TEXTS, 2, 400, seed=1)
    entered = []

    @contextlib.contextmanager
    def runner():
        entered.append("in")
        yield len(entered)

    seen = []
    progress = []
    result = run_task(
        model,
        tok,
        task,
        samples,
        runner=runner,
        max_new_tokens=2,
        progress=lambda done, total: progress.append((done, total)),
        on_sample=lambda value, sample, record: (seen.append((value, sample.id)), record.update(kv_bytes=value)),
    )
    assert entered == ["in", "in"] and [v for v, _ in seen] == [1, 2]
    assert [r["kv_bytes"] for r in result.per_sample] == [1, 2] and progress == [(1, 2), (2, 2)]
    plain = run_task(model, tok, task, samples, max_new_tokens=2)
    assert plain.predictions == result.predictions  # a transparent runner changes nothing


def test_a_perfect_prediction_scores_100_and_suites_average_their_tasks(model, tok):
    task = get_task("ruler/niah_single")
    (sample,) = task.generate(tok, TEXTS, 1, 400, seed=0)
    assert task.score([f" {sample.answers[0]}."], [sample]) == 100.0
    r = run_task(model, tok, task, [sample], max_new_tokens=1)
    r.score = 100.0
    r2 = run_task(model, tok, get_task("broad/manyshot"), [], max_new_tokens=1)
    assert suite_scores([r, r2]) == {"ruler": 100.0, "broad": 0.0}


def test_registry_lists_every_task_with_its_suite():
    rows = list_tasks()
    names = [r["name"] for r in rows]
    assert {"ruler/niah_single", "ruler/cwe", "broad/continuation", "longbench/hotpotqa"} <= set(names)
    assert all(r["suite"] in ("broad", "ruler", "longbench", "decode") and r["description"] for r in rows)
    assert [t.name for t in tasks_for("broad,vt")] == ["broad/continuation", "broad/manyshot", "ruler/vt"]
    assert len(tasks_for("longbench", longbench={"source": "x"})) == 10
    with pytest.raises(ValueError, match="unknown task"):
        get_task("nope")


def test_samples_round_trip_through_json_dicts(tok):
    (s,) = get_task("ruler/vt").generate(tok, TEXTS, 1, 2500, seed=0)
    assert Sample.from_dict(s.to_dict()) == s
