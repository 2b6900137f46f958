"""ΔPPL collector: perplexity on the continuation with one cell applied, minus FullKV perplexity.

For a sample (context c, continuation x_0..x_{m-1}) the per-token negative log-likelihoods are
``nll_0`` (x_0 predicted from the context's last position; no cell can change it, since every
compression happens after the prompt's own attention) and ``nll_t`` for t ≥ 1 (x_t predicted from the
continuation position t-1). A sample's score is their mean; the table's PPL is ``exp`` of the mean over
samples (all samples have the same m, so this is the pooled token PPL), and
``ΔPPL = PPL(cell) − PPL(FullKV)``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from signals import model_parts

#: fp32 logits materialized at once when scoring many rows (elements): 2**25 ≈ 128 MiB.
LOGIT_CHUNK = 1 << 25


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``-log p(target)`` per position: ``logits`` ``[C, t, V]``, ``targets`` ``[t]`` → float64 ``[C, t]``."""
    c, t, v = logits.shape
    flat = F.cross_entropy(logits.float().reshape(c * t, v), targets.expand(c, t).reshape(-1), reduction="none")
    return flat.reshape(c, t).double()


def continuation_nll(model, hidden: torch.Tensor, continuation: torch.Tensor, first_nll: float) -> torch.Tensor:
    """Mean NLL over the continuation, per row, from the last layer's output ``hidden`` ``[C, m, d]``.

    Positions 0..m-2 predict x_1..x_{m-1}; ``first_nll`` is x_0's (from the context). The head runs
    on row chunks so that at most :data:`LOGIT_CHUNK` logits exist at once. Returns float64 ``[C]``.
    """
    c, m, _ = hidden.shape
    if m < 2:
        return torch.full((c,), first_nll, dtype=torch.float64)
    vocab = model.get_output_embeddings().weight.shape[0]
    rows = max(1, LOGIT_CHUNK // ((m - 1) * vocab))
    sums = []
    for start in range(0, c, rows):
        lg = model_parts.logits(model, hidden[start : start + rows, :-1])
        sums.append(token_nll(lg, continuation[1:]).sum(dim=-1))
    return (torch.cat(sums).cpu() + first_nll) / m


def mean_nll_to_ppl(mean_nll: float) -> float:
    return math.exp(mean_nll)


def aggregate_ppl(per_sample_mean_nll: Sequence[float]) -> float:
    """PPL over samples of equal length: ``exp`` of the mean of their mean NLLs."""
    return math.exp(sum(per_sample_mean_nll) / len(per_sample_mean_nll))
