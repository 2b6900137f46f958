"""K-norm: keep the keys with the lowest L2 norm.

Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression",
EMNLP 2024, https://arxiv.org/abs/2406.11430
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class KNorm(Pattern):
    """Score each cached token by minus the L2 norm of its (post-RoPE) key, per KV head."""

    name: ClassVar[str] = "knorm"

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        return -layer.keys.float().norm(dim=-1)
