"""Calibration/evaluation samples and the split behind them, with a tokenizer built in-test."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from polykv_search.data import (
    CALIB_TITLES,
    EVAL_TITLES,
    NOVELS,
    Corpus,
    DataError,
    Document,
    describe_samples,
    describe_split,
    make_samples,
    samples_fingerprint,
    split_corpus,
)


def word_tokenizer(corpus: Corpus) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over the corpus' words (one token per word), with BOS/EOS."""
    words = sorted({w for d in corpus.documents for w in d.text.split()})
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2} | {w: i + 3 for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>", eos_token="</s>", model_max_length=64
    )


def corpus_of(name: str, lengths: dict[str, int]) -> Corpus:
    """Documents whose words are unique (``ID.k``), so a window's ids pin down where it was cut."""
    docs = [
        Document(id=i, title=i, text=" ".join(f"{i.replace(' ', '_')}.{k}" for k in range(n)))
        for i, n in lengths.items()
    ]
    return Corpus(name=name, documents=docs)


AUSTEN = corpus_of("austen", {title: 300 + 40 * k for k, (_, title) in enumerate(NOVELS)})
TOKENIZER = word_tokenizer(AUSTEN)


def sample(corpus=AUSTEN, tokenizer=TOKENIZER, **kw):
    args = dict(n_samples=6, context_len=20, continuation_len=5, seed=0) | kw
    return make_samples(tokenizer, corpus, **args)


def test_windows_have_exact_lengths_and_come_from_the_document():
    samples = sample(n_samples=12)
    assert len(samples) == 12
    for s in samples:
        assert len(s.context_ids) == 20 and len(s.continuation_ids) == 5
        words = TOKENIZER.convert_ids_to_tokens(s.context_ids + s.continuation_ids)
        prefix = s.doc_id.replace(" ", "_")
        assert words == [f"{prefix}.{s.offset + k}" for k in range(25)]  # contiguous, no BOS/EOS


def test_same_seed_same_samples_other_seed_other_samples():
    a, b, c = sample(seed=1), sample(seed=1), sample(seed=2)
    assert a == b and samples_fingerprint(a) == samples_fingerprint(b)
    assert samples_fingerprint(a) != samples_fingerprint(c)


def test_windows_never_overlap_even_at_full_capacity():
    lengths = {"a": 100, "b": 60, "c": 75, "d": 50}
    corpus = corpus_of("tiny", lengths)
    tok = word_tokenizer(corpus)
    docs = split_corpus(corpus, "eval")
    capacity = sum(lengths[d.id] // 25 for d in docs)
    kw = dict(context_len=20, continuation_len=5, seed=3, role="eval")
    samples = make_samples(tok, corpus, n_samples=capacity, **kw)
    spans = sorted((s.doc_id, s.offset) for s in samples)
    for (d1, o1), (d2, o2) in zip(spans, spans[1:]):
        assert d1 != d2 or o2 - o1 >= 25
    assert all(s.offset + 25 <= lengths[s.doc_id] for s in samples)
    too_many = f"hold {capacity} non-overlapping windows of 20\\+5 tokens, {capacity + 1} requested"
    with pytest.raises(DataError, match=too_many):
        make_samples(tok, corpus, n_samples=capacity + 1, **kw)


def test_austen_split_is_fixed_and_disjoint():
    assert [d.id for d in split_corpus(AUSTEN, "calib")] == list(CALIB_TITLES)
    assert [d.id for d in split_corpus(AUSTEN, "eval")] == list(EVAL_TITLES)
    calib = {s.doc_id for s in sample(n_samples=30)}
    evaluation = {s.doc_id for s in sample(n_samples=30, role="eval")}
    assert calib <= set(CALIB_TITLES) and evaluation <= set(EVAL_TITLES)


def test_hash_split_is_deterministic_disjoint_and_about_half():
    corpus = corpus_of("many", {f"doc{i}": 30 for i in range(200)})
    calib, evaluation = split_corpus(corpus, "calib"), split_corpus(corpus, "eval")
    ids_c, ids_e = {d.id for d in calib}, {d.id for d in evaluation}
    assert not ids_c & ids_e and len(ids_c | ids_e) == 200 and 70 < len(ids_c) < 130
    # a document's side depends on its id only: removing other documents does not move it
    fewer = corpus_of("many", {f"doc{i}": 30 for i in range(0, 200, 3)})
    assert {d.id for d in split_corpus(fewer, "calib")} == {i for i in ids_c if int(i[3:]) % 3 == 0}


@pytest.mark.parametrize("n", [2, 3, 5])
def test_small_corpora_get_at_least_one_document_per_side(n):
    corpus = corpus_of("small", {f"d{i}": 30 for i in range(n)})
    calib, evaluation = split_corpus(corpus, "calib"), split_corpus(corpus, "eval")
    assert calib and evaluation and len(calib) + len(evaluation) == n


def test_austen_selection_on_one_side_is_split_by_hash():
    corpus = Corpus(name="austen", documents=[AUSTEN["Emma"], AUSTEN["Persuasion"]])
    record = describe_split(corpus, "calib")
    assert record["method"].startswith("hash") and len(record["calib"]) == len(record["eval"]) == 1


def test_a_single_document_is_split_into_halves():
    corpus = corpus_of("one", {"book": 400})
    calib, evaluation = split_corpus(corpus, "calib"), split_corpus(corpus, "eval")
    assert [d.id for d in calib] == ["book#1of2"] and [d.id for d in evaluation] == ["book#2of2"]
    assert calib[0].text + evaluation[0].text == corpus["book"].text
    assert calib[0].text.endswith(" ") and abs(len(calib[0].text) - len(evaluation[0].text)) < 12
    assert "halves" in describe_split(corpus, "eval")["method"]
    tok = word_tokenizer(corpus)
    s = make_samples(tok, corpus, n_samples=4, context_len=30, continuation_len=10, seed=0, role="eval")
    assert {x.doc_id for x in s} == {"book#2of2"}


def test_split_and_samples_are_recorded_as_json():
    samples = sample()
    record = describe_samples(samples, AUSTEN, role="calib", seed=0, context_len=20, continuation_len=5)
    json.dumps(record)
    assert record["split"]["documents"] == list(CALIB_TITLES)
    assert record["split"]["eval"] == list(EVAL_TITLES)
    assert record["split"]["corpus"]["fingerprint"] == AUSTEN.fingerprint
    assert record["fingerprint"] == samples_fingerprint(samples)
    assert record["windows"] == [[s.doc_id, s.offset] for s in samples]


def test_too_short_corpus_and_bad_arguments():
    with pytest.raises(DataError, match="too short.*longest 380 tokens"):
        sample(context_len=400, continuation_len=10)
    with pytest.raises(DataError, match="n_samples must be an integer >= 1"):
        sample(n_samples=0)
    with pytest.raises(DataError, match="continuation_len must be an integer >= 0"):
        sample(continuation_len=-1)
    with pytest.raises(DataError, match="unknown split role 'train'"):
        sample(role="train")
    assert all(s.continuation_ids == [] for s in sample(continuation_len=0))
