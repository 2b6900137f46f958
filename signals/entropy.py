"""Entropy and variance collector: how spread out FullKV attention is in each (layer, phase).

- **entropy** of a query's attention row ``p`` over the ``k`` keys it may see is
  ``-Σ p log p / log k`` (1 = uniform, 0 = one key); the signal is the mean over query heads and over
  the phase's queries (rows with a single visible key are skipped). Prefill queries: the prompt's n
  tokens over the prompt; decoding queries: the continuation's m tokens over prompt + continuation so
  far (teacher-forced FullKV).
- **variance** (CAKE's temporal shift): ``Σ_keys Var_queries p[q, key]``, mean over query heads, over
  an observation window of queries: the last ``window`` prompt queries in prefill (CAKE's window,
  which keeps the causal mask out of the statistic), the continuation's queries in decoding.

Computed once per sample from the FullKV pass (:mod:`signals.fullkv`), averaged over samples.
"""

from __future__ import annotations

import math

import torch

#: Queries whose attention rows are materialized at once.
QUERY_CHUNK = 256
#: CAKE's observation window (prompt queries) for the prefill variance.
VARIANCE_WINDOW = 32


def attention_entropy(layer, queries: torch.Tensor, query_positions: torch.Tensor) -> float:
    """Mean normalized entropy of ``queries`` ``[1, Hq, q, D]`` over ``layer``'s cached keys."""
    total, count = 0.0, 0
    for start in range(0, queries.shape[-2], QUERY_CHUNK):
        q = queries[..., start : start + QUERY_CHUNK, :]
        pos = query_positions[start : start + QUERY_CHUNK]
        probs = layer.attention_probs(q, pos)  # [B, Hq, c, n] fp32, masked keys exactly 0
        ent = -torch.special.xlogy(probs, probs).sum(dim=-1)  # [B, Hq, c]
        keys = layer.allowed(pos)[:, :1].sum(dim=-1)  # [B, 1, c]: same on every head here
        ok = keys > 1
        norm = torch.where(ok, keys.double().clamp(min=2).log(), torch.ones((), dtype=torch.float64))
        ratio = (ent.double() / norm) * ok
        total += float(ratio.sum())
        count += int(ok.sum()) * probs.shape[1]
    return total / count if count else math.nan


def attention_variance(layer, queries: torch.Tensor, query_positions: torch.Tensor) -> float:
    """``Σ_keys Var_queries`` of the attention of ``queries`` ``[1, Hq, w, D]``, mean over heads."""
    if queries.shape[-2] < 2:
        return 0.0
    probs = layer.attention_probs(queries, query_positions).double()  # [B, Hq, w, n]
    return float(probs.var(dim=-2, unbiased=False).sum(dim=-1).mean())


def phase_stats(layer, queries: torch.Tensor, query_positions: torch.Tensor, phase: str, window: int = VARIANCE_WINDOW):
    """``(entropy, variance)`` of one phase's queries (see the module docstring)."""
    entropy = attention_entropy(layer, queries, query_positions)
    if phase == "prefill":
        queries, query_positions = queries[..., -window:, :], query_positions[-window:]
    return entropy, attention_variance(layer, queries, query_positions)
