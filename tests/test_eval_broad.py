"""The broad suite: held-out continuation and many-shot in-context classification."""

from __future__ import annotations

import math

import pytest

from polykv_search.evaluation import SampleCheckError, get_task, prompt_length, task_names
from polykv_search.evaluation.broad import Continuation, ManyShotClassification, bos_ids
from tests.test_eval_support import char_tokenizer, haystack_texts

TEXTS = haystack_texts()
TOK = char_tokenizer()


def test_the_broad_suite_has_continuation_and_manyshot():
    assert task_names("broad") == ["broad/continuation", "broad/manyshot"]


def test_continuation_cuts_a_window_of_context_plus_continuation_tokens():
    task = get_task("broad/continuation", continuation_len=16)
    samples = task.generate(TOK, TEXTS, 3, 200, seed=0)
    for s in samples:
        task.check(s)
        assert len(s.context_ids) == 200 and s.context_ids[0] == 1  # BOS + 199 text tokens
        assert len(s.target_ids) == 16
        doc = TEXTS[s.meta["document"]]
        window = TOK.decode(s.context_ids[1:] + s.target_ids)
        assert window in doc  # contiguous text of one held-out document
    again = task.generate(TOK, TEXTS, 3, 200, seed=0)
    assert [s.to_dict() for s in samples] == [s.to_dict() for s in again]
    assert [s.to_dict() for s in task.generate(TOK, TEXTS, 3, 200, seed=1)] != [s.to_dict() for s in samples]


def test_continuation_joins_short_documents_and_refuses_too_little_text():
    task = Continuation(continuation_len=4)
    (s,) = task.generate(TOK, ["short one. ", "short two. ", "short three."], 1, 20, seed=0)
    assert s.meta["document"] == "all documents" and len(s.context_ids) == 20
    with pytest.raises(ValueError, match="tokens"):
        task.generate(TOK, ["tiny"], 1, 20, seed=0)


def test_continuation_score_is_token_accuracy_and_ppl_is_reported_beside_it():
    task = Continuation(continuation_len=4)
    preds = [{"correct": 3, "total": 4, "nll": 4 * math.log(2)}, {"correct": 1, "total": 4, "nll": 4 * math.log(8)}]
    assert task.score(preds, [None, None]) == 50.0
    assert task.extra_metrics(preds, [None, None])["ppl"] == pytest.approx(4.0)  # exp(mean log 2, log 8)


def test_manyshot_shows_hundreds_of_labelled_examples_and_a_seen_query():
    task = get_task("broad/manyshot")
    samples = task.generate(TOK, None, 3, 4000, seed=0)
    mapping = task.mapping(0)
    for s in samples:
        task.check(s)
        assert s.meta["examples"] >= 100  # ~25 characters per example at 4000 characters
        assert s.answers == [mapping[s.meta["query"]]]
        assert s.question == f"Input: {s.meta['query']}\nLabel:"
        assert 0.98 * 4000 <= prompt_length(TOK, s) <= 4000
    assert [s.to_dict() for s in samples] == [s.to_dict() for s in task.generate(TOK, None, 3, 4000, seed=0)]
    assert task.mapping(1) != mapping  # the labelling is fixed by the seed


def test_manyshot_checker_rejects_inconsistent_labels():
    task = ManyShotClassification()
    (s,) = task.generate(TOK, None, 1, 600, seed=0)
    q = s.meta["query"]
    wrong = next(label for label in task.labels if label != s.answers[0])
    s.context += f"Input: {q}\nLabel: {wrong}\n"
    with pytest.raises(SampleCheckError):
        task.check(s)


def test_manyshot_scores_the_first_word_of_the_answer():
    task = ManyShotClassification()
    (s,) = task.generate(TOK, None, 1, 600, seed=0)
    label = s.answers[0]
    assert task.score([f" {label.title()}\nInput: x"], [s]) == 100.0
    assert task.score([" banana " + label], [s]) == 0.0


def test_bos_ids_detects_the_tokenizers_prefix():
    assert bos_ids(TOK) == [1]
