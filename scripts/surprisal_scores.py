"""Question-free prompt scores from a model's own next-token loss, for the recall diagnosis (diagnosis only).

A token's *surprisal* is ``-log p(x_i | x_<i)`` under the unevicted model; a *word's* is the sum over its tokens,
Selective Context's lexical unit (Li et al., "Compressing Context to Enhance Inference Efficiency of Large Language
Models", EMNLP 2023, https://arxiv.org/abs/2310.06201). A random 5-digit number costs about log 10 nats a digit,
no more than a prose token, but as one word of five digits it is among the prompt's most informative words.

A word's score can be carried to its *sentence* (every token scored with the highest word score of its sentence),
so that a kept number keeps the statement that ties a name to it; the word score is either the sum over all its
tokens, over its tokens after the first (``tail``: what the model could not complete once the word began, high
for a number's digits, low for a prose word's ending), or over its tokens after its first *visible* one, special
tokens left out (``rest``: ``tail`` without a line break's or a space's token counting as the word's beginning).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: A token's kind (:func:`token_kinds`): whitespace only, visible text, or a special token of the tokenizer.
BLANK, VISIBLE, SPECIAL = 0, 1, 2


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


def token_kinds(tokenizer, ids: Sequence[int]) -> torch.Tensor:
    """Each token's kind: :data:`SPECIAL` (one of the tokenizer's special ids), :data:`BLANK` (whitespace only) or
    :data:`VISIBLE`."""
    special = set(tokenizer.all_special_ids)
    kinds = [SPECIAL if i in special else VISIBLE if tokenizer.decode([i]).strip() else BLANK for i in ids]
    return torch.tensor(kinds, dtype=torch.long)


def tail_mask(words: torch.Tensor, kinds: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens of each word after its first token (``kinds`` None), or after its first visible token with the
    special tokens left out (``kinds``: :func:`token_kinds`)."""
    at = torch.arange(len(words))
    if kinds is None:
        first = torch.full((int(words.max()) + 1,), len(words)).scatter_reduce(0, words, at, "amin")
        return at > first[words]
    seen = at.masked_fill(kinds != VISIBLE, len(words))
    first = torch.full((int(words.max()) + 1,), len(words)).scatter_reduce(0, words, seen, "amin")
    return (at > first[words]) & (kinds != SPECIAL)


def sentence_max(per_token: torch.Tensor, sentences: torch.Tensor) -> torch.Tensor:
    """Every token scored with the highest ``per_token`` value of its sentence (``sentences``: :func:`sentence_ids`)."""
    top = torch.full((int(sentences.max()) + 1,), float("-inf"), dtype=per_token.dtype)
    return top.scatter_reduce(0, sentences, per_token, "amax")[sentences]


def carried(
    per_token: torch.Tensor,
    words: torch.Tensor,
    sentences: torch.Tensor,
    word: str = "sum",
    sinks: int = 0,
    kinds: torch.Tensor | None = None,
) -> torch.Tensor:
    """The sentence unit's score: each word scored by the sum of its tokens' surprisal (``word="sum"``), of its
    tokens after the first (``"tail"``) or after its first visible one, special tokens left out (``"rest"``;
    ``kinds``: :func:`token_kinds`), every token given its sentence's highest word score, and the first ``sinks``
    tokens (the attention sinks) ranked above every other token."""
    if word not in ("sum", "tail", "rest"):
        raise ValueError(f"word must be sum, tail or rest, got {word!r}")
    if word == "rest" and kinds is None:
        raise ValueError("word=rest needs the tokens' kinds")
    if word != "sum":
        per_token = per_token * tail_mask(words, kinds if word == "rest" else None)
    score = sentence_max(word_sums(per_token, words), sentences)
    if sinks:
        score[:sinks] = score.max() + 1.0
    return score


def rank_of(score: torch.Tensor, index: Sequence[int]) -> list[int]:
    """Ranks (0: highest score; ties: the older token first, as the share's selection) of the tokens ``index``."""
    order = torch.sort(score, descending=True, stable=True).indices
    return [int((order == k).nonzero()) for k in index]
