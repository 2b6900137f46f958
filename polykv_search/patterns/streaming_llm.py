"""StreamingLLM: attention sinks plus a recent window.

Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024,
https://arxiv.org/abs/2309.17453
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern, protected_ends
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class StreamingLLM(Pattern):
    """Keep the first ``n_sink`` tokens and the most recent ``budget - n_sink``.

    Parameters
    ----------
    n_sink : int
        Attention-sink tokens kept at the start (the paper uses 4).
    """

    name: ClassVar[str] = "streaming_llm"
    n_sink: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.n_sink, int) or self.n_sink < 0:
            raise ValueError(f"n_sink must be a non-negative integer, got {self.n_sink!r}")

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        return torch.zeros(layer.valid.shape, device=layer.valid.device)

    def protected(self, layer: LayerView, budget: int) -> torch.Tensor:
        return protected_ends(layer, budget, self.n_sink, budget)
