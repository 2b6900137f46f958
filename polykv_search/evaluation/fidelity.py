"""What a teacher-forced continuation says about an entry: next-token hits, NLL, and its fidelity to FullKV.

Fidelity (docs/design.md §2) is the per-token KL(FullKV ‖ entry) of the next-token distributions on the
continuation (0 for FullKV) and ΔNLL = NLL_entry − NLL_FullKV: paired, continuous, lower-variance
measures beside accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Float64 log-softmax over the vocabulary (``[m, V]``): the precision KL of near-equal models needs."""
    return torch.log_softmax(logits.double(), dim=-1)


def token_kl(reference: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-position KL(reference ‖ entry) from two log-prob tensors ``[..., V]``: summed in float64,
    clipped at 0 against rounding (it is non-negative by construction)."""
    return (reference.exp() * (reference - logp)).sum(dim=-1, dtype=torch.float64).clamp_min(0.0)


def continuation_outcome(
    logits: torch.Tensor, target_ids: Sequence[int], reference: torch.Tensor | None = None
) -> dict[str, Any]:
    """Score next-token predictions ``logits`` ``[m, V]`` of the continuation ``target_ids`` (length m).

    Returns ``correct`` (greedy argmax hits), ``total`` (m) and ``nll`` (summed, nats); with the FullKV
    ``reference`` log-probs (:func:`log_probs` of FullKV's logits on the same tokens) also ``kl`` (mean
    per-token KL(FullKV ‖ entry), clipped at 0 against rounding) and ``dnll`` (mean per-token ΔNLL).
    """
    target = torch.as_tensor(list(target_ids), dtype=torch.long, device=logits.device)
    if logits.shape[0] != target.shape[0]:
        raise ValueError(f"{logits.shape[0]} logit rows for {target.shape[0]} continuation tokens")
    logp = log_probs(logits)
    nll = -logp.gather(-1, target[:, None])[:, 0]
    out: dict[str, Any] = {
        "correct": int((logits.argmax(dim=-1) == target).sum()),
        "total": int(target.shape[0]),
        "nll": float(nll.sum()),
    }
    if reference is not None:
        if reference.shape != logp.shape:
            raise ValueError(f"reference log-probs {tuple(reference.shape)} do not match logits {tuple(logp.shape)}")
        kl = token_kl(reference, logp)
        ref_nll = -reference.gather(-1, target[:, None])[:, 0]
        out["kl"] = float(kl.mean())
        out["dnll"] = float((nll - ref_nll).mean())
    return out
