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

    All KV heads of a layer share one selection, as in the paper.
    """

    name: ClassVar[str] = "tova"

    def pre_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        state.row["query"] = query[..., -1:, :]
        state.shared["query_pos"] = layer.query_range[-1:]

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        probs = layer.attention_probs(state.row["query"], state.shared["query_pos"])  # [B, Hq, 1, n]
        shared = probs[:, :, 0, :].mean(dim=1, keepdim=True)  # [B, 1, n]
        return shared.expand(-1, layer.num_kv_heads, -1)
