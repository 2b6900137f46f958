"""Question-free prompt scores from a model's own next-token loss, for the recall diagnosis (diagnosis only).

A token's *surprisal* is ``-log p(x_i | x_<i)`` under the unevicted model; a *word's* is the sum over its tokens,
Selective Context's lexical unit (Li et al., "Compressing Context to Enhance Inference Efficiency of Large Language
Models", EMNLP 2023, https://arxiv.org/abs/2310.06201). A random 5-digit number costs about log 10 nats a digit,
no more than a prose token, but as one word of five digits it is among the prompt's most informative words.

A word's score can be carried to its *sentence* (every token scored with the highest word score of its sentence),
so that a kept number keeps the statement that ties a name to it; the word score is either the sum over all its
tokens or over its tokens after the first (``tail``: what the model could not complete once the word began, high
for a number's digits, low for a prose word's ending).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def prompt_surprisal(model, ids: Sequence[int]) -> torch.Tensor:
    """``-log p(x_i | x_<i)`` of every prompt token (nats), one plain forward; 0 for the first token."""
    with torch.inference_mode():
        logits = model(torch.tensor([list(ids)])).logits[0].float()
    out = torch.zeros(len(ids))
    out[1:] = -torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(list(ids[1:]))[:, None])[:, 0]
    return out


def word_ids(tokenizer, ids: Sequence[int]) -> torch.Tensor:
    """The word each token belongs to (0, 1, ...): a token whose text starts with whitespace starts a new word,
    every other token continues the word before it (the first token starts word 0)."""
    starts = [k == 0 or tokenizer.decode([i])[:1].isspace() for k, i in enumerate(ids)]
    return torch.tensor(starts, dtype=torch.long).cumsum(0) - 1


def word_sums(per_token: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Every token scored with the sum of ``per_token`` over its word (``words``: :func:`word_ids`)."""
    sums = torch.zeros(int(words.max()) + 1, dtype=per_token.dtype).index_add_(0, words, per_token)
    return sums[words]


def sentence_ids(tokenizer, ids: Sequence[int]) -> torch.Tensor:
    """The sentence each token belongs to (0, 1, ...): a sentence ends after a token whose text holds a line break
    or ends, closing quotes and brackets aside, with ``.``, ``!`` or ``?``."""
    ends = []
    for i in ids:
        text = tokenizer.decode([i])
        ends.append("\n" in text or text.rstrip(" \"')]").endswith((".", "!", "?")))
    starts = torch.tensor([False] + ends[:-1], dtype=torch.long)
    return starts.cumsum(0)


def sentence_max(per_token: torch.Tensor, sentences: torch.Tensor) -> torch.Tensor:
    """Every token scored with the highest ``per_token`` value of its sentence (``sentences``: :func:`sentence_ids`)."""
    top = torch.full((int(sentences.max()) + 1,), float("-inf"), dtype=per_token.dtype)
    return top.scatter_reduce(0, sentences, per_token, "amax")[sentences]


def carried(
    per_token: torch.Tensor, words: torch.Tensor, sentences: torch.Tensor, word: str = "sum", sinks: int = 0
) -> torch.Tensor:
    """The sentence unit's score: each word scored by the sum of its tokens' surprisal (``word="sum"``) or of its
    tokens after the first (``"tail"``), every token given its sentence's highest word score, and the first
    ``sinks`` tokens (the attention sinks) ranked above every other token."""
    if word not in ("sum", "tail"):
        raise ValueError(f"word must be sum or tail, got {word!r}")
    if word == "tail":
        first = torch.ones_like(words, dtype=torch.bool)
        first[1:] = words[1:] != words[:-1]
        per_token = per_token.masked_fill(first, 0.0)
    score = sentence_max(word_sums(per_token, words), sentences)
    if sinks:
        score[:sinks] = score.max() + 1.0
    return score


def rank_of(score: torch.Tensor, index: Sequence[int]) -> list[int]:
    """Ranks (0: highest score; ties: the older token first, as the share's selection) of the tokens ``index``."""
    order = torch.sort(score, descending=True, stable=True).indices
    return [int((order == k).nonzero()) for k in index]
