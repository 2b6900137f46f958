"""Random eviction: the floor every informed pattern must beat."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class Random(Pattern):
    """Keep a uniformly random subset, independently per KV head.

    Deterministic: the generator is seeded from ``seed``, the layer index and the layer's eviction
    count, and drawn on the CPU so CPU and CUDA runs keep the same tokens.
    """

    name: ClassVar[str] = "random"
    batch_exact: ClassVar[bool] = False  # the draws depend on the batch shape and each row's eviction count
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        return random_scores(self.seed, layer.layer_idx, layer.num_evictions, tuple(layer.valid.shape)).to(
            layer.valid.device
        )


def random_scores(seed: int, layer_idx: int, eviction: int, shape: tuple[int, ...]) -> torch.Tensor:
    digest = hashlib.sha256(f"{seed}/{layer_idx}/{eviction}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.rand(shape, generator=gen)
