"""Eviction patterns, one per file, registered by name.

>>> from polykv_search.patterns import make_pattern
>>> make_pattern("snapkv", window=16).window
16
"""

from __future__ import annotations

from typing import Any

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.expected_attention import ExpectedAttention
from polykv_search.patterns.full import Full
from polykv_search.patterns.h2o import H2O
from polykv_search.patterns.keydiff import KeyDiff
from polykv_search.patterns.knorm import KNorm
from polykv_search.patterns.kvzip import KVzip
from polykv_search.patterns.pyramidkv import PyramidKV
from polykv_search.patterns.random import Random
from polykv_search.patterns.snapkv import SnapKV
from polykv_search.patterns.state import PatternState
from polykv_search.patterns.streaming_llm import StreamingLLM
from polykv_search.patterns.tova import TOVA

PATTERNS: dict[str, type[Pattern]] = {
    cls.name: cls
    for cls in (
        Full,
        StreamingLLM,
        H2O,
        TOVA,
        SnapKV,
        PyramidKV,
        KNorm,
        Random,
        KeyDiff,
        ExpectedAttention,
        KVzip,
    )
}


def get_pattern_class(name: str) -> type[Pattern]:
    try:
        return PATTERNS[name]
    except KeyError:
        raise KeyError(f"unknown pattern {name!r}; known: {', '.join(PATTERNS)}") from None


def make_pattern(name: str, **params: Any) -> Pattern:
    """Instantiate a pattern by name; unknown parameters raise ``TypeError``."""
    return get_pattern_class(name)(**params)


__all__ = [
    "PATTERNS",
    "LayerView",
    "Pattern",
    "PatternState",
    "get_pattern_class",
    "make_pattern",
    *[c.__name__ for c in PATTERNS.values()],
]
