"""RULER-style generators: deterministic, checkable, and sized to the requested context length."""

from __future__ import annotations

import re

import pytest

from polykv_search.evaluation import SampleCheckError, encode_prompt, get_task, prompt_length, task_names
from polykv_search.evaluation.ruler import CommonWordsExtraction, VariableTracking
from tests.test_eval_support import char_tokenizer, haystack_texts

TEXTS = haystack_texts()
TOK = char_tokenizer()
CHAT_TOK = char_tokenizer(chat=True)
RULER = task_names("ruler")
# One character per token, so the word-list and variable tasks need room for their fixed text.
LENGTH = {"ruler/vt": 2200, "ruler/cwe": 2200}


def generate(name, n=3, seed=0, tok=TOK, texts=TEXTS, length=None):
    return get_task(name).generate(tok, texts, n, length or LENGTH.get(name, 1000), seed)


def test_the_ruler_suite_has_the_six_paper_tasks():
    assert RULER == [
        "ruler/niah_single",
        "ruler/niah_multikey",
        "ruler/niah_multivalue",
        "ruler/niah_multiquery",
        "ruler/vt",
        "ruler/cwe",
    ]


@pytest.mark.parametrize("name", RULER)
def test_generators_are_deterministic_under_a_seed(name):
    a = [s.to_dict() for s in generate(name, n=2, seed=7)]
    b = [s.to_dict() for s in generate(name, n=2, seed=7)]
    c = [s.to_dict() for s in generate(name, n=2, seed=8)]
    assert a == b
    assert a != c
    assert a[0]["context"] != a[1]["context"]  # samples differ from each other


@pytest.mark.parametrize("name", RULER)
def test_every_answer_is_recoverable_from_the_context(name):
    task = get_task(name)
    for sample in generate(name, n=3, seed=3, tok=CHAT_TOK):
        task.check(sample)  # parses the context alone; raises when the answer is not there
        assert sample.answers and all(a for a in sample.answers)


@pytest.mark.parametrize("name", RULER)
def test_prompt_length_is_within_tolerance_of_the_target(name):
    target = LENGTH.get(name, 1000)
    for tok in (TOK, CHAT_TOK):
        for sample in generate(name, n=2, seed=1, tok=tok):
            n = prompt_length(tok, sample)
            # The haystack grows in whole words (niah, cwe) or whole noise lines (vt, ~90 tokens).
            slack = 100 if name == "ruler/vt" else 0.02 * target
            assert target - slack <= n <= target, (name, n)
            assert sample.meta["prompt_tokens"] == n


def test_the_passkey_is_a_5_to_7_digit_number_in_the_needle_sentence():
    for sample in generate("ruler/niah_single", n=6):
        (value,) = sample.answers
        assert re.fullmatch(r"\d{5,7}", value)
        assert f"The special magic number is {value}." in sample.context
        assert value not in sample.question  # the question does not give it away
        assert sample.answer_prefix.strip() == "The special magic number mentioned in the provided text is"


def test_multiquery_asks_for_all_values_and_multikey_for_one():
    mq = generate("ruler/niah_multiquery", n=1)[0]
    assert len(mq.answers) == 4 and all(q in mq.question for q in mq.meta["queries"])
    mk = generate("ruler/niah_multikey", n=1)[0]
    assert len(mk.answers) == 1 and mk.context.count("One of the special magic numbers for") == 4
    mv = generate("ruler/niah_multivalue", n=1)[0]
    assert len(mv.answers) == 4 and len(mv.meta["queries"]) == 1


def test_the_checker_catches_a_wrong_or_missing_answer():
    task = get_task("ruler/niah_single")
    sample = generate("ruler/niah_single", n=1)[0]
    sample.answers = ["1234567" if sample.answers[0] != "1234567" else "7654321"]
    with pytest.raises(SampleCheckError):
        task.check(sample)
    vt = generate("ruler/vt", n=1)[0]
    vt.context = vt.context.replace(f"VAR {vt.answers[-1]} = VAR", "VAR QQQQQ = VAR")
    with pytest.raises(SampleCheckError):
        get_task("ruler/vt").check(vt)


def test_variable_tracking_resolves_chains_through_the_whole_context():
    text = "VAR AAAAA = 12345\nnoise\nVAR BBBBB = VAR AAAAA \nVAR CCCCC = 999\nVAR DDDDD = VAR BBBBB "
    assert VariableTracking.resolve(text, "12345") == ["AAAAA", "BBBBB", "DDDDD"]


def test_common_words_have_a_clear_top_ten_and_pad_a_small_vocabulary():
    (sample,) = generate("ruler/cwe", n=1, texts=["tiny text"], length=2200)
    get_task("ruler/cwe").check(sample)
    assert len(sample.answers) == 10
    assert CommonWordsExtraction.vocabulary(["Alpha beta gamma x"])[:2] == ["abundant", "acorn"]


def test_chat_prompts_split_after_the_context_and_force_the_answer_prefix():
    sample = generate("ruler/niah_single", n=1, tok=CHAT_TOK)[0]
    context_ids, question_ids = encode_prompt(CHAT_TOK, sample)
    context = CHAT_TOK.decode(context_ids)
    question = CHAT_TOK.decode(question_ids)
    assert context.startswith("<s><|user|>\nA special magic number is hidden") and context_ids.count(1) == 1
    assert context.endswith(sample.context)
    assert question.startswith(sample.question + "</turn>\n<|assistant|>\n")
    assert question.endswith("The special magic number mentioned in the provided text is")
    # Without a template: BOS + context, then question + answer prefix.
    plain_c, plain_q = encode_prompt(TOK, sample)
    assert plain_c[0] == 1 and TOK.decode(plain_q) == sample.question + sample.answer_prefix


def test_samples_are_independent_of_how_many_are_drawn():
    three = generate("ruler/niah_multikey", n=3, seed=5)
    one = generate("ruler/niah_multikey", n=1, seed=5)
    assert one[0].to_dict() == three[0].to_dict()


def test_a_too_short_context_length_is_a_clear_error():
    with pytest.raises(ValueError, match="too short"):
        generate("ruler/niah_single", length=50)
    with pytest.raises(ValueError, match="empty"):
        generate("ruler/niah_single", texts=[])


def test_vt_and_cwe_keep_rulers_solved_example_only_when_the_context_has_room():
    for name in ("ruler/vt", "ruler/cwe"):
        (short,) = generate(name, n=1, length=1000)
        (long,) = generate(name, n=1, length=2200)
        assert not short.meta["fewshot"] and long.meta["fewshot"]
        get_task(name).check(short)
    (vt,) = generate("ruler/vt", n=1, length=2200)
    assert vt.context.count("Question: Find all variables") == 1  # the solved example's question
