"""The decode suite's recall variants: ``decode/recall_spread`` (facts spread through a long passage, several
questions after the generation, scored per question) and ``decode/recall_carry`` (the question stated before
the generation, answered after it). Registered by name; the old decode tasks keep their samples."""

from __future__ import annotations

import random
import re

import pytest

from polykv_search import scoring
from polykv_search.evaluation import get_task, list_tasks, samples_fingerprint, tasks_for
from polykv_search.evaluation.decode import NAMES
from polykv_search.evaluation.decode_spread import HEAD, spread, statement
from polykv_search.evaluation.samples import Sample
from tests.test_eval_support import char_tokenizer, haystack_texts
from tests.test_scoring_engines import entries
from tests.tiny import tiny_model

WORDS = (
    "the a house letter garden walked said morning evening sister brother father mother friend long short quiet"
).split()


def fixed_texts() -> list[str]:
    """Seeded prose of short sentences, independent of the Python version (unlike pydoc's topics)."""
    rng = random.Random(7)
    docs = []
    for _ in range(6):
        sentences = []
        for _ in range(60):
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
            sentences.append(" ".join(words).capitalize() + rng.choice([".", ".", "?", "!"]))
        docs.append(" ".join(sentences))
    return docs


def spread_samples(chat: bool, n: int = 3, seed: int = 0, texts=None) -> list[Sample]:
    task = get_task("decode/recall_spread", generate_len=32)
    return task.generate(char_tokenizer(chat=chat), texts or haystack_texts(), n, 1024, seed=seed)


def passage_of(sample: Sample, chat: bool) -> str:
    """The passage (with its facts) inside the decoded prompt: after the head, before the template's end."""
    text = char_tokenizer(chat=chat).decode(sample.context_ids, skip_special_tokens=True)
    body = text[text.index(HEAD) + len(HEAD) :]
    return body[: body.rindex("</turn>")] if chat else body


# ------------------------------------------------------------------------------------------ registry
@pytest.mark.parametrize("chat", [False, True])
def test_old_decode_tasks_keep_their_samples(chat):
    """Fingerprints taken from the code before the variants existed (same seed, same samples)."""
    pinned = {
        "decode/trajectory": "3d4d6ad125161bc6",
        "decode/recall": "c0d9e2f8ef57f7c9" if chat else "ba9c5e2429cd085a",
    }
    for name, fingerprint in pinned.items():
        task = get_task(name, generate_len=32)
        assert task.version == "1"
        samples = task.generate(char_tokenizer(chat=chat), fixed_texts(), 3, 300, seed=4)
        assert samples_fingerprint(samples) == fingerprint, name


def test_variants_are_registered_and_run_by_name_only():
    rows = {t["name"]: t["default"] for t in list_tasks("decode")}
    assert rows == {
        "decode/trajectory": True,
        "decode/recall": True,
        "decode/recall_spread": False,
        "decode/recall_carry": False,
    }
    assert [t.name for t in tasks_for("decode")] == ["decode/trajectory", "decode/recall"]
    named = scoring.resolve_tasks("decode,recall_spread,recall_carry", generate_len=48)
    assert [t.name for t in named] == list(rows)
    assert all(t.generate_len == 48 and t.kind == "trajectory" for t in named)


# ------------------------------------------------------------------------------------- recall_spread
@pytest.mark.parametrize("chat", [False, True])
def test_spread_prompt_has_the_length_asked_for_with_every_fact_once(chat):
    for s in spread_samples(chat):
        assert 1024 - 16 <= len(s.context_ids) <= 1024
        text = passage_of(s, chat)
        assert len(s.meta["facts"]) == 8 and all(text.count(f) == 1 for f in s.meta["facts"])
        assert len({f.split()[4] for f in s.meta["facts"]}) == 8  # eight distinct names


@pytest.mark.parametrize("texts", [haystack_texts, fixed_texts])
def test_spread_facts_lie_over_the_whole_passage(texts):
    for s in spread_samples(chat=False, n=4, texts=texts()):
        text = passage_of(s, chat=False)
        depths = [text.index(f) / len(text) for f in s.meta["facts"]]
        assert depths == pytest.approx(s.meta["depths"], abs=2e-3)  # the recorded depths are the real ones
        assert depths == sorted(depths)
        assert depths[0] < 1 / 8 + 0.05 and depths[-1] > 1 - 1 / 8 - 0.1
        assert max(b - a for a, b in zip([0.0] + depths, depths + [1.0])) < 2.5 / 8


def test_spread_puts_facts_at_sentence_starts_in_prose():
    for s in spread_samples(chat=False, n=4, texts=fixed_texts()):
        text = passage_of(s, chat=False)
        for fact in s.meta["facts"]:
            before = text[: text.index(fact)]
            assert before == "" or re.search(r"[.!?] $", before), before[-20:]


def test_spread_places_no_fact_after_a_title():
    passage = "She met Mr. Elton there. " * 20
    text, _ = spread(passage, [statement(n, "12345") for n in NAMES[:4]], random.Random(0))
    assert "Mr. The secret" not in text and text.count("The secret number of") == 4


@pytest.mark.parametrize("chat", [False, True])
def test_spread_asks_several_questions_after_the_generation(chat):
    for s in spread_samples(chat):
        asked = s.meta["asked"]
        assert len(asked) == 3 == len(s.answers) == len(set(s.answers))
        for name, number in zip(asked, s.answers):
            assert statement(name, number) in s.meta["facts"]
            assert name in s.question
        assert s.answer_prefix == f"{asked[0]}:" and s.question.endswith(s.answer_prefix)
        assert ("<|user|>" in s.question) == chat


def test_spread_scores_every_question_and_a_sample_by_their_mean():
    task = get_task("decode/recall_spread")
    s = spread_samples(chat=False, n=1)[0]
    (a, b, c), (x, y, z) = s.meta["asked"], s.answers
    unasked = [f for f in s.meta["facts"] if f.split()[4] not in (a, b, c)]
    other = unasked[0].split()[-1].rstrip(".")  # the number of a fact nobody asked about

    def scored(answer: str) -> tuple[list[bool], float]:
        return task.hits(answer, s), task.score([{"answer": answer}], [s])

    assert scored(f" {x}\n{b}: {y}\n{c}: {z}") == ([True, True, True], 100.0)
    assert scored(f" {x}\n{c}: {z}\n{b}: {y}") == ([True, True, True], 100.0)  # any order
    hits, score = scored(f" {x}\n{b}: {other}\n{c}: {z}")
    assert hits == [True, False, True] and score == pytest.approx(200 / 3)
    assert scored(f" {y}\n{b}: {x}") == ([False, False, False], 0.0)  # swapped numbers, c not answered
    assert scored(f" {x}\n{b}:\n{c}: {z}")[0] == [True, False, True]  # b's line has no number
    assert scored("")[0] == [False, False, False]
    assert task.score([{"answer": f" {x}"}, {"answer": ""}], [s, s]) == pytest.approx(100 / 6)


def test_spread_is_seeded_and_refuses_a_short_context():
    a, b = spread_samples(chat=True, seed=3), spread_samples(chat=True, seed=3)
    assert [s.to_dict() for s in a] == [s.to_dict() for s in b]
    assert spread_samples(chat=True, n=1, seed=3)[0].to_dict() == a[0].to_dict()  # sample i: same for any n
    assert [s.context_ids for s in spread_samples(chat=True, seed=4)] != [s.context_ids for s in a]
    with pytest.raises(ValueError, match="too short for decode/recall_spread"):
        get_task("decode/recall_spread").generate(char_tokenizer(), haystack_texts(), 1, 300, seed=0)


# -------------------------------------------------------------------------------------- recall_carry
@pytest.mark.parametrize("chat", [False, True])
def test_carry_states_its_question_before_the_generation_only(chat):
    tok = char_tokenizer(chat=chat)
    task = get_task("decode/recall_carry", generate_len=32)
    samples = task.generate(tok, haystack_texts(), 3, 400, seed=1)
    assert [s.to_dict() for s in samples] == [s.to_dict() for s in task.generate(tok, haystack_texts(), 3, 400, 1)]
    for s in samples:
        context = tok.decode(s.context_ids, skip_special_tokens=True)
        asked, carried = s.meta["asked"], s.meta["carried_question"]
        assert asked in carried and context.count(carried) == 1  # the prompt, before the generation point
        assert context.index(statement(asked, s.answers[0])) < context.index(carried) < context.index("passage")
        assert 380 <= len(s.context_ids) <= 400
        # after the generation: a cue that names no one, so the question has to be carried
        assert not any(name in s.question for name in NAMES)
        assert s.answer_prefix == "The secret number is" and s.question.endswith(s.answer_prefix)
        assert task.score([{"answer": f" {s.answers[0]}."}], [s]) == 100.0
        assert task.score([{"answer": " 1"}], [s]) == 0.0


# ------------------------------------------------------------------------------------ through scoring
def test_variants_run_through_both_engines_with_per_question_records():
    model, tok = tiny_model("llama"), char_tokenizer(chat=True)
    tasks = scoring.resolve_tasks("recall_spread,recall_carry", generate_len=6)
    samples = scoring.make_task_samples(tok, tasks, haystack_texts(), n_samples=1, context_len=640, seed=0)
    es = entries(24)[:2]  # full, one uniform
    shared = scoring.score_entries(model, tok, es, samples, engine="shared")
    per = scoring.score_entries(model, tok, es, samples, engine="per-entry")
    for a, b in zip(shared, per):
        assert a["scores"] == b["scores"]
        for name, (task, task_samples) in samples.items():
            (record,) = a["tasks"][name]["per_sample"]
            assert record["prediction"]["answer"] == b["tasks"][name]["per_sample"][0]["prediction"]["answer"]
            hits = task.hits(record["prediction"]["answer"], task_samples[0]) if name.endswith("spread") else None
            if hits is not None:
                assert record["score"] == pytest.approx(100 * sum(hits) / 3)
            assert record["prediction"]["total"] == 6 and "kl" in record
