"""Retrieval heads: per KV head, how often its strongest attention lands on the context token being copied.

Wu et al., "Retrieval Head Mechanistically Explains Long-Context Factuality", https://arxiv.org/abs/2404.15574.
Their retrieval score of a head is the share of a needle's tokens the head *copies*: at a step that emits a
needle token, the head's most-attended key is that token's position in the needle.

The variant computed here, on calibration-split evidence samples (:mod:`polykv_search.data.evidence`: the
answer's token run occurs exactly once in the context, inside the queried statement):

* the answer is **teacher-forced** (no generation), so a *hit* of query head ``h`` on answer token ``i``
  is: the query that predicts token ``i`` (the position before it) attends most, among every key it may
  see, to the context position of token ``i`` in the evidence. Ties go to the earliest key (``argmax``);
* a head's score on a sample is its hits over the answer's tokens; the table holds the mean over
  samples and its standard error;
* query heads are aggregated to their **KV head by the maximum**: a KV head must keep the whole context
  if any query head that reads it retrieves.

Attention comes from the model's own eager kernel (``output_attentions=True``) under FullKV: no
eviction is involved, so the runtime is not needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats


def copy_pairs(sample) -> list[tuple[int, int]]:
    """``(query position, source position)`` of every answer token of an evidence sample, both absolute
    positions in context + continuation: the query that predicts the token, and where the token sits in
    the context's queried statement."""
    n = len(sample.context_ids)
    start, end = sample.scored
    answer = list(sample.continuation_ids[start:end])
    a, b = sample.evidence_spans[sample.queried]
    statement = list(sample.context_ids[a:b])
    at = [i for i in range(len(statement) - len(answer) + 1) if statement[i : i + len(answer)] == answer]
    if len(at) != 1 or start < 1:
        raise ValueError(f"sample {sample.doc_id}@{sample.offset}: the answer is not copied once from its statement")
    return [(n + start + i - 1, a + at[0] + i) for i in range(len(answer))]


def head_hits(attentions: Sequence[torch.Tensor], pairs: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Per layer and query head ``[L, Hq]``, the share of ``pairs`` whose query attends most to its source.

    ``attentions``: per layer ``[Hq, T, T]`` (or ``[1, Hq, T, T]``) attention probabilities."""
    queries = torch.tensor([q for q, _ in pairs])
    sources = torch.tensor([s for _, s in pairs])
    out = []
    for probs in attentions:
        probs = probs[0] if probs.dim() == 4 else probs
        top = probs[:, queries, :].float().argmax(dim=-1)  # [Hq, len(pairs)]
        out.append((top == sources.to(top.device)).float().mean(dim=-1).cpu())
    return torch.stack(out)


def kv_head_scores(per_query_head: torch.Tensor, groups: int) -> torch.Tensor:
    """``[L, Hq]`` to ``[L, Hkv]``: the maximum over each KV head's query heads (query heads ``h*g .. h*g+g-1``
    read KV head ``h``, as in transformers' ``repeat_kv``)."""
    L, hq = per_query_head.shape
    return per_query_head.reshape(L, hq // groups, groups).amax(dim=-1)


@dataclass(frozen=True)
class RetrievalScores:
    """Per (layer, KV head): the mean retrieval score over samples, its standard error, the per-sample values."""

    mean: np.ndarray  #: [L, Hkv]
    se: np.ndarray  #: [L, Hkv]; NaN with one sample
    per_sample: np.ndarray  #: [S, L, Hkv]

    @property
    def n_samples(self) -> int:
        return int(self.per_sample.shape[0])

    def top(self, k: int) -> list[tuple[int, int, float]]:
        """The ``k`` highest-scoring ``(layer, kv head, mean)``; ties broken towards lower layers and heads."""
        flat = [(float(self.mean[l, h]), l, h) for l in range(self.mean.shape[0]) for h in range(self.mean.shape[1])]
        flat.sort(key=lambda t: (-t[0], t[1], t[2]))
        return [(l, h, s) for s, l, h in flat[:k]]


@torch.no_grad()
def retrieval_scores(model, samples: Sequence, on_sample=None) -> RetrievalScores:
    """Retrieval scores of every KV head of ``model`` on evidence ``samples`` (see the module docstring).

    The model runs once per sample on context + continuation with its eager kernel (restored after)."""
    if not samples:
        raise ValueError("retrieval scores need at least one evidence sample")
    config = model.config
    groups = config.num_attention_heads // config.num_key_value_heads
    device = next(model.parameters()).device
    previous = config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        rows = []
        for sample in samples:
            ids = torch.tensor([list(sample.context_ids) + list(sample.continuation_ids)], device=device)
            attentions = model(ids, output_attentions=True, use_cache=False).attentions
            rows.append(kv_head_scores(head_hits(attentions, copy_pairs(sample)), groups).numpy())
            if on_sample is not None:
                on_sample()
    finally:
        model.set_attn_implementation(previous)
    per_sample = np.stack(rows).astype(np.float64)
    se = stats.sem(per_sample, axis=0) if len(rows) > 1 else np.full(per_sample.shape[1:], np.nan)
    return RetrievalScores(per_sample.mean(axis=0), np.asarray(se), per_sample)
