"""TOVA: Token Omission Via Attention.

Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024, https://arxiv.org/abs/2401.06104
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class TOVA(Pattern):
    """Keep the tokens the newest query attends to most, averaged over all heads.

    A token's score is the attention the newest query gives it, averaged over the layer's query heads; a head
    that does not hold the token gives it none. When every KV head holds the same tokens (TOVA from the prompt
    on, as in the paper and kvpress's ``TOVAPress``) this is the mean over heads slot by slot, and all heads
    share one selection. After a per-head prefill (``snapkv``, ``h2o``, ...) the heads hold different tokens:
    each then ranks the tokens it holds by that per-token score (docs/design.md, "TOVA after a per-head
    prefill").
    """

    name: ClassVar[str] = "tova"

    def pre_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        state.row["query"] = query[..., -1:, :]
        state.shared["query_pos"] = layer.query_range[-1:]

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        probs = layer.attention_probs(state.row["query"], state.shared["query_pos"])[:, :, 0, :]  # [B, Hq, n]
        shared = probs.mean(dim=1, keepdim=True).expand(-1, layer.num_kv_heads, -1)  # [B, Hkv, n]
        held = layer.positions.masked_fill(~layer.valid, -1)
        aligned = (held == held[:, :1]).all(dim=2).all(dim=1)  # [B]: every head holds the same tokens
        if bool(aligned.all()):
            return shared
        per_token = held_token_mean(probs, layer.positions, layer.valid, layer.seen)
        return torch.where(aligned[:, None, None], shared, per_token)  # an aligned row keeps its exact mean


def held_token_mean(probs: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, seen: int) -> torch.Tensor:
    """``[B, Hkv, n]``: for each slot, the attention its token gets from every query head (``probs``,
    ``[B, Hq, n]``, over each head's own slots), averaged over the query heads, 0 from a head that does not hold
    the token. ``positions``/``valid``: ``[B, Hkv, n]``, the token each slot holds and whether it is real."""
    B, Hq, n = probs.shape
    groups = Hq // positions.shape[1]
    index = positions.masked_fill(~valid, seen).repeat_interleave(groups, dim=1)  # padding: a column of its own
    real = probs.masked_fill(~valid.repeat_interleave(groups, dim=1), 0.0)
    dense = probs.new_zeros(B, Hq, seen + 1).scatter_(2, index, real)  # [B, Hq, token]; a head holds a token once
    token = dense[..., :seen].mean(dim=1)  # [B, seen]
    out = token.unsqueeze(1).expand(-1, positions.shape[1], -1).gather(2, positions.masked_fill(~valid, 0))
    return out.masked_fill(~valid, 0.0)
