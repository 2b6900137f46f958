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
    """Mean normalized entropy of ``queries`` ``[1, Hq, q, D]`` over ``layer``'s cached keys.

    ``layer`` holds a FullKV cache of one sequence (every head keeps the same tokens), so one
    ``[q, n]`` mask serves all heads; the entropy of a row is ``−Σ p log p``.
    """
    keys = layer.repeat_heads(layer.keys).float()  # [1, Hq, n, D]
    kpos = layer.positions[0, 0]
    kvalid = layer.valid[0, 0]
    total, count = 0.0, 0
    for start in range(0, queries.shape[-2], QUERY_CHUNK):
        q = queries[..., start : start + QUERY_CHUNK, :].float()
        qpos = query_positions[start : start + QUERY_CHUNK].to(kpos.device)
        allowed = kvalid[None, :] & (kpos[None, :] <= qpos[:, None])
        if layer.sliding_window is not None:
            allowed &= (qpos[:, None] - kpos[None, :]) < layer.sliding_window
        # a large finite negative bias (not -inf): exp underflows to exactly 0 and p*z stays finite
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=q.device).masked_fill_(~allowed, -1e30)
        logits = torch.baddbmm(
            bias.expand(q.shape[1], -1, -1), q[0], keys[0].transpose(-1, -2), alpha=layer.scaling
        )  # [Hq, c, n]
        logp = torch.log_softmax(logits, dim=-1)
        ent = -torch.einsum("hqn,hqn->hq", logp.exp(), logp)  # [Hq, c]
        keys_seen = allowed.sum(dim=-1)  # [c]
        ok = keys_seen > 1
        norm = keys_seen.clamp(min=2).double().log()
        ratio = (ent.double() / norm) * ok
        total += float(ratio.sum())
        count += int(ok.sum()) * ent.shape[0]
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
