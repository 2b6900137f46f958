"""ΔPPL and KL collectors: the continuation's next-token distributions with one cell applied.

For a sample (context c, continuation x_0..x_{m-1}) the per-token negative log-likelihoods are
``nll_0`` (x_0 predicted from the context's last position; no cell can change it, since every
compression happens after the prompt's own attention) and ``nll_t`` for t ≥ 1 (x_t predicted from the
continuation position t-1). A sample's score is their mean; the table's PPL is ``exp`` of the mean over
samples (all samples have the same m, so this is the pooled token PPL), and
``ΔPPL = PPL(cell) − PPL(FullKV)``.

KL: per position t, ``KL_t = Σ_v p_full(v) · (log p_full(v) − log p_cell(v))`` of the two
next-token distributions (``KL_0 = 0`` for the same reason as ``nll_0``); the signal is the mean over
the m positions. Each ``KL_t`` is clamped at 0 against float rounding, so the signal is
non-negative by construction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from polykv_search.evaluation import fidelity
from signals import model_parts

#: fp32 logits materialized at once when scoring many rows (elements): 2**25 ≈ 128 MiB.
LOGIT_CHUNK = 1 << 25


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``-log p(target)`` per position: ``logits`` ``[C, t, V]``, ``targets`` ``[t]`` → float64 ``[C, t]``."""
    c, t, v = logits.shape
    flat = F.cross_entropy(logits.float().reshape(c * t, v), targets.expand(c, t).reshape(-1), reduction="none")
    return flat.reshape(c, t).double()


def token_kl(full_logprobs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``KL(full ‖ cell)`` per position: ``full_logprobs`` ``[t, V]`` (log-softmax of FullKV),
    ``logits`` ``[C, t, V]`` of the cells → float64 ``[C, t]``, each ``>= 0``."""
    return fidelity.token_kl(full_logprobs.float()[None], torch.log_softmax(logits.float(), dim=-1))


def continuation_token_stats(
    model, hidden: torch.Tensor, continuation: torch.Tensor, first_nll: float, full_logprobs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL and KL on the continuation, per row, from the last layer's output ``hidden``
    ``[C, m, d]``; ``full_logprobs`` ``[m-1, V]`` are FullKV's at positions 0..m-2.

    Positions 0..m-2 predict x_1..x_{m-1}; ``first_nll`` is x_0's (from the context; KL 0). The head
    runs on row chunks so that at most :data:`LOGIT_CHUNK` logits exist at once. Returns two float64
    ``[C, m]`` tensors (on the CPU).
    """
    c, m, _ = hidden.shape
    first = torch.full((c, 1), first_nll, dtype=torch.float64)
    if m < 2:
        return first, torch.zeros((c, 1), dtype=torch.float64)
    vocab = model.get_output_embeddings().weight.shape[0]
    rows = max(1, LOGIT_CHUNK // ((m - 1) * vocab))
    nll, kl = [], []
    for start in range(0, c, rows):
        lg = model_parts.logits(model, hidden[start : start + rows, :-1])
        nll.append(token_nll(lg, continuation[1:]).cpu())
        kl.append(token_kl(full_logprobs, lg).cpu())
    zero = torch.zeros((c, 1), dtype=torch.float64)
    return torch.cat([first, torch.cat(nll)], dim=1), torch.cat([zero, torch.cat(kl)], dim=1)


def mean_nll_to_ppl(mean_nll: float) -> float:
    return math.exp(mean_nll)


def aggregate_ppl(per_sample_mean_nll: Sequence[float]) -> float:
    """PPL over samples of equal length: ``exp`` of the mean of their mean NLLs."""
    return math.exp(sum(per_sample_mean_nll) / len(per_sample_mean_nll))
