"""The recall diagnosis's question-free scores (scripts/surprisal_scores.py): surprisal per token, per word, and a
word's score carried to its sentence."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from scripts.surprisal_scores import (
    BLANK,
    SPECIAL,
    VISIBLE,
    carried,
    prompt_surprisal,
    rank_of,
    sentence_ids,
    sentence_max,
    token_kinds,
    word_ids,
    word_sums,
)


class _Tokenizer:
    """Decodes each id to a fixed piece of text."""

    def __init__(self, pieces: list[str], special: tuple[int, ...] = ()):
        self.pieces = pieces
        self.all_special_ids = list(special)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def test_a_word_starts_at_a_token_whose_text_starts_with_whitespace():
    # "The secret number of Mary is 40712.\nThe" as SmolLM2 writes it
    pieces = ["The", " secret", " number", " of", " Mary", " is", " ", "4", "0", "7", "1", "2", ".", "\n", "The"]
    words = word_ids(_Tokenizer(pieces), list(range(len(pieces))))
    assert words.tolist() == [0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 6, 7, 7]


def test_the_first_token_starts_a_word_whatever_its_text():
    assert word_ids(_Tokenizer(["a", "b", " c"]), [0, 1, 2]).tolist() == [0, 0, 1]


def test_every_token_of_a_word_is_scored_with_the_words_sum():
    torch.manual_seed(0)
    per_token = torch.rand(40, dtype=torch.float64) * 5
    words = torch.tensor(sorted(torch.randint(0, 12, (40,)).tolist()))
    words = torch.unique(words, return_inverse=True)[1]  # consecutive word ids 0, 1, ...
    naive = [sum(float(per_token[j]) for j in range(40) if words[j] == words[i]) for i in range(40)]
    assert word_sums(per_token, words).tolist() == pytest.approx(naive, rel=1e-12)


def test_surprisal_is_the_next_token_loss_given_the_left_context():
    ids = [3, 1, 4, 1, 5]
    logits = torch.randn(1, len(ids), 7, generator=torch.Generator().manual_seed(1))
    model = lambda batch: SimpleNamespace(logits=logits)  # noqa: E731
    out = prompt_surprisal(model, ids)
    assert out[0] == 0
    for i in range(1, len(ids)):
        row = logits[0, i - 1].double()
        expected = -(row[ids[i]] - math.log(float(row.exp().sum())))
        assert float(out[i]) == pytest.approx(float(expected), rel=1e-5)


def test_ranks_count_from_the_highest_score_and_ties_go_to_the_older_token():
    score = torch.tensor([1.0, 3.0, 2.0, 3.0, 0.5])
    assert rank_of(score, [1, 3, 2, 0, 4]) == [0, 1, 2, 3, 4]


def test_a_sentence_ends_after_a_line_break_or_a_full_stop_question_or_exclamation_mark():
    # 'Mr. Darcy!\n\nThe secret number of Mary is 40712.\nHe said "No." Then' as SmolLM2 writes it
    pieces = ["Mr", ".", " Dar", "cy", "!", "\n", "\n", "The", " secret", " is", " ", "4", "0", ".", "\n"]
    pieces += ["He", " said", ' "', "No", '."', " Then", ";", " and"]
    sentences = sentence_ids(_Tokenizer(pieces), list(range(len(pieces))))
    assert sentences.tolist() == [0, 0, 1, 1, 1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 5, 6, 6, 6, 6, 6, 7, 7, 7]


def _random_units(n: int, units: int, seed: int) -> torch.Tensor:
    """Consecutive unit ids 0, 1, ... for ``n`` tokens (at most ``units`` of them)."""
    ids = torch.tensor(sorted(torch.randint(0, units, (n,), generator=torch.Generator().manual_seed(seed)).tolist()))
    return torch.unique(ids, return_inverse=True)[1]


def test_every_token_of_a_sentence_is_scored_with_its_sentences_highest_value():
    per_token = torch.rand(50, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 7 - 1
    sentences = _random_units(50, 9, seed=3)
    naive = [max(float(per_token[j]) for j in range(50) if sentences[j] == sentences[i]) for i in range(50)]
    assert sentence_max(per_token, sentences).tolist() == naive


@pytest.mark.parametrize("word", ["sum", "tail", "rest"])
@pytest.mark.parametrize("sinks", [0, 4])
def test_the_sentence_score_is_its_best_words_score_with_the_sinks_first(word, sinks):
    n = 60
    per_token = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 5
    words = _random_units(n, 25, seed=5)
    kinds = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(6))
    sentences = torch.tensor([int(words[i]) // 6 for i in range(n)])  # a sentence: six whole words
    sentences = torch.unique(sentences, return_inverse=True)[1]

    def word_score(w: int) -> float:  # the naive reference, token by token
        tokens = [j for j in range(n) if words[j] == w]
        if word == "tail":
            tokens = tokens[1:]
        if word == "rest":  # after the first visible token, special tokens left out
            visible = [j for j in tokens if kinds[j] == VISIBLE]
            tokens = [j for j in tokens if visible and j > visible[0] and kinds[j] != SPECIAL]
        return sum(float(per_token[j]) for j in tokens)

    naive = [max(word_score(int(words[j])) for j in range(n) if sentences[j] == sentences[i]) for i in range(n)]
    naive[:sinks] = [max(naive) + 1.0] * sinks
    out = carried(per_token, words, sentences, word, sinks, kinds)
    assert out.tolist() == pytest.approx(naive, rel=1e-12)
    assert rank_of(out, list(range(sinks))) == list(range(sinks))


def test_a_words_tail_leaves_out_its_first_token():
    per_token = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    words = torch.tensor([0, 0, 1, 2, 2])
    sentences = torch.tensor([0, 1, 2, 3, 4])  # one sentence a token: the word scores themselves
    assert carried(per_token, words, sentences, "tail").tolist() == [2.0, 2.0, 0.0, 5.0, 5.0]
    assert carried(per_token, words, sentences, "sum").tolist() == [3.0, 3.0, 3.0, 9.0, 9.0]


def test_a_words_rest_starts_after_its_first_visible_token_and_leaves_out_special_tokens():
    # "\n", "Bing", "ley", "!"  |  " ", "4", "0"  |  " not", "<|im_end|>"
    per_token = torch.tensor([9.0, 8.0, 3.0, 1.0, 0.5, 2.0, 2.5, 4.0, 20.0])
    words = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])
    kinds = torch.tensor([BLANK, VISIBLE, VISIBLE, VISIBLE, BLANK, VISIBLE, VISIBLE, VISIBLE, SPECIAL])
    out = carried(per_token, words, torch.arange(9), "rest", kinds=kinds)
    assert out.tolist() == [4.0, 4.0, 4.0, 4.0, 2.5, 2.5, 2.5, 0.0, 0.0]


def test_a_tokens_kind_is_special_blank_or_visible():
    tok = _Tokenizer(["<|im_end|>", "\n", " ", "The", " 4"], special=(0,))
    assert token_kinds(tok, [0, 1, 2, 3, 4]).tolist() == [SPECIAL, BLANK, BLANK, VISIBLE, VISIBLE]


def test_an_unknown_word_score_is_refused_and_rest_needs_the_kinds():
    none = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="word must be sum, tail or rest"):
        carried(torch.zeros(3), none, none, "max")
    with pytest.raises(ValueError, match="needs the tokens' kinds"):
        carried(torch.zeros(3), none, none, "rest")


def test_the_asked_statement_is_every_token_of_its_fact_and_nothing_around_it():
    from scripts.recall_diagnosis import fact_spans

    pieces = ["Facts", ".", "\n", "The", " secret", " number", " of", " Mary", " is", " ", "4", "0", ".", "\n"]
    pieces += ["The", " secret", " number", " of", " Bob", " is", " ", "7", "1", ".", "\n", "Go"]
    facts = ["The secret number of Mary is 40.", "The secret number of Bob is 71."]
    spans = fact_spans(_Tokenizer(pieces), list(range(len(pieces))), facts, "Bob", "71")
    assert spans["statement"] == list(range(14, 24))
    assert spans["value"] == [21, 22]
    assert spans["name"] == [18]
    assert spans["facts"] == list(range(3, 13)) + list(range(14, 24))
