"""PyramidKV's scoring: SnapKV with the PyramidKV code's defaults.

Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling",
https://arxiv.org/abs/2406.02069. The pyramid-shaped per-layer budget schedule is a strategy
generator (``solvers/pyramid.py``), not part of this pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from polykv_search.patterns.snapkv import SnapKV


@dataclass(frozen=True)
class PyramidKV(SnapKV):
    """SnapKV scoring with an 8-query window, kernel 7 and max pooling (KVCache-Factory defaults)."""

    name: ClassVar[str] = "pyramidkv"
    window: int = 8
    kernel: int = 7
    pooling: str = "maxpool"
