"""Synthetic-data generators never draw forever: what is asked for is checked against what their
vocabularies can supply before anything is drawn, and every draw loop is bounded (issue 30).

A hang fails these tests (``time_limit``); the tokenizer is never reached (``None`` is passed)."""

from __future__ import annotations

import random

import pytest

from polykv_search.data import DataError
from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix
from polykv_search.data.evidence_vocab import CAPACITY, TOWNS, check_records, distinct_pairs, draw_pair
from polykv_search.evaluation.broad import ManyShotClassification
from polykv_search.evaluation.ruler import CommonWordsExtraction, NiahMultiKey, VariableTracking
from polykv_search.evaluation.ruler.haystack import DEPTHS, KEY_POPULATION, draw_distinct
from tests.bad_inputs_support import time_limit  # noqa: F401  (autouse: a hang fails the test)

# --------------------------------------------------------------------------------------------
# Evidence records


def test_each_kind_holds_at_most_its_smaller_vocabulary():
    assert CAPACITY == {"record": 39, "code": 136, "fact": len(TOWNS)}
    for kind, cap in CAPACITY.items():  # the limit is reachable: that many distinct pairs are drawn
        pairs = distinct_pairs(kind, cap, random.Random(0))
        assert len({k for k, _ in pairs}) == len({v for _, v in pairs}) == cap
        with pytest.raises(DataError, match=f"at most {cap}"):
            distinct_pairs(kind, cap + 1, random.Random(0))


@pytest.mark.parametrize(
    "records,evidence,match",
    [(40, 1, "record sample can hold"), (20, 2, None), (20, 3, "fact sample can hold"), (10**6, 1, "at most 39")],
)
def test_records_are_checked_against_the_kinds_used(records, evidence, match):
    if match is None:
        check_records(records, evidence)  # record and code kinds only: 20 fit
        return
    with pytest.raises(DataError, match=match):
        check_records(records, evidence)


def test_make_calibration_samples_refuses_before_drawing_anything():
    """No tokenizer and no corpus are touched: the request is refused first."""
    mix = parse_retrieval_mix("3", records=20)
    with pytest.raises(DataError, match="at most 19"):
        make_calibration_samples(None, None, n_samples=3, context_len=4096, continuation_len=32, seed=0, mix=mix)
    mix = parse_retrieval_mix("1", records=30)
    with pytest.raises(DataError, match="context_len 200 is too short for 30 evidence records"):
        make_calibration_samples(None, None, n_samples=1, context_len=200, continuation_len=32, seed=0, mix=mix)


def test_the_draw_loop_is_bounded_even_if_every_draw_repeats(monkeypatch):
    import polykv_search.data.evidence_vocab as vocab

    monkeypatch.setattr(vocab, "draw_pair", lambda kind, rng: ("AB-123", "saffron"))
    with pytest.raises(DataError, match="could not draw 2 distinct record statements"):
        vocab.distinct_pairs("record", 2, random.Random(0))


def test_distinct_pairs_draws_as_the_old_loop_did():
    """The bounded loop consumes the RNG exactly as the unbounded one did: seeded samples are unchanged."""
    for kind in CAPACITY:
        rng, old = random.Random(7), random.Random(7)
        pairs: list[tuple[str, str]] = []
        while len(pairs) < 12:
            key, value = draw_pair(kind, old)
            if all(key != k and value != v for k, v in pairs):
                pairs.append((key, value))
        assert distinct_pairs(kind, 12, rng) == pairs and rng.random() == old.random()


# --------------------------------------------------------------------------------------------
# RULER needles and keys, variable names, made-up words, many-shot items


def test_draw_distinct_refuses_more_than_exist_and_never_loops_forever():
    with pytest.raises(ValueError, match="cannot draw 5 distinct keys: only 4 exist"):
        draw_distinct(lambda: 1, 5, set(), "keys", 4)
    with pytest.raises(ValueError, match="could not draw 2 distinct keys"):
        draw_distinct(lambda: 1, 2, set(), "keys", 100)  # a draw that always repeats
    assert draw_distinct(iter(range(10)).__next__, 3, {0}, "keys", 10) == [1, 2, 3]


@pytest.mark.parametrize(
    "cls,settings,match",
    [
        (NiahMultiKey, {"num_keys": len(DEPTHS) + 1}, "insertion depths"),
        (NiahMultiKey, {"num_keys": KEY_POPULATION + 1}, "distinct keys exist"),
        (NiahMultiKey, {"num_queries": 5}, "queries <= keys"),
        (VariableTracking, {"num_chains": 10**5}, "distinct values or names"),
        (VariableTracking, {"num_chains": 9, "haystack": "text"}, "insertion depths"),
        (CommonWordsExtraction, {"freq_cw": 3}, "repeated more often"),
        (CommonWordsExtraction, {"num_cw": 0}, "common words"),
        (ManyShotClassification, {"labels": ("north",)}, "2 or more distinct labels"),
        (ManyShotClassification, {"pool_size": 0}, "pool of 1 or more"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_tasks_refuse_settings_their_vocabularies_cannot_meet_before_drawing(cls, settings, match):
    task = type(f"Bad{cls.__name__}", (cls,), settings)()
    with pytest.raises(ValueError, match=match):
        task.generate(None, ["Some haystack text. More of it."], 2, 4096, 0)


def test_more_made_up_words_than_the_syllables_allow_are_refused():
    from polykv_search.evaluation.ruler import common_words

    with pytest.raises(ValueError, match="distinct made-up words"):
        common_words.pseudo_words(10**8)
