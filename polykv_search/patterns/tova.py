"""TOVA: Token Omission Via Attention.

Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024, https://arxiv.org/abs/2401.06104
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import Pattern


@dataclass(frozen=True)
class TOVA(Pattern):
    """Keep the tokens the newest query attends to most, averaged over all heads.

    All KV heads of a layer share one selection, as in the paper.
    """

    name: ClassVar[str] = "tova"

    def pre_kernel(self, layer, state, query) -> None:
        state["query"] = query[..., -1:, :]
        state["query_pos"] = layer.query_range[-1:]

    def score(self, layer, state) -> torch.Tensor:
        probs = layer.attention_probs(state["query"], state["query_pos"])  # [B, Hq, 1, n]
        shared = probs[:, :, 0, :].mean(dim=1, keepdim=True)  # [B, 1, n]
        return shared.expand(-1, layer.num_kv_heads, -1)
