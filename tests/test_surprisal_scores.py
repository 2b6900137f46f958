"""The recall diagnosis's question-free scores (scripts/surprisal_scores.py): surprisal per token and per word."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from scripts.surprisal_scores import prompt_surprisal, rank_of, word_ids, word_sums


class _Tokenizer:
    """Decodes each id to a fixed piece of text."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

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
