"""FullKV: keep every token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class Full(Pattern):
    """No eviction; the reference every other pattern is measured against."""

    name: ClassVar[str] = "full"
    keeps_all: ClassVar[bool] = True

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        return torch.zeros(layer.valid.shape, device=layer.valid.device)
