"""Eviction patterns, one per file, registered by name.

>>> from polykv_search.patterns import make_pattern
>>> make_pattern("snapkv", window=16).window
16
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.evidence import Evidence
from polykv_search.patterns.expected_attention import ExpectedAttention
from polykv_search.patterns.full import Full
from polykv_search.patterns.h2o import H2O
from polykv_search.patterns.keydiff import KeyDiff
from polykv_search.patterns.knorm import KNorm
from polykv_search.patterns.kvzip import KVzip
from polykv_search.patterns.pyramidkv import PyramidKV
from polykv_search.patterns.random import Random
from polykv_search.patterns.snapkv import SnapKV
from polykv_search.patterns.spec import parse_spec, spec_label, split_specs
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
        Evidence,
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


def checked_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` checked by pattern ``name``, less those at their defaults, in the order given (``ValueError``,
    one line, naming what is wrong)."""
    if name not in PATTERNS:
        raise ValueError(f"unknown pattern {name!r}; known: {', '.join(PATTERNS)}")
    try:
        made = make_pattern(name, **params).params()
    except (TypeError, ValueError) as err:
        raise ValueError(f"pattern {spec_label(name, params)!r}: {err}") from None
    defaults = PATTERNS[name]().params()
    return {k: made[k] for k in params if made[k] != defaults.get(k)}


def pattern_spec(text: str) -> tuple[str, dict[str, Any]]:
    """A checked pattern spec (:mod:`~polykv_search.patterns.spec`) as ``(name, params)``, the parameters as
    :func:`checked_params` gives them."""
    name, params = parse_spec(text)
    if name not in PATTERNS and text.strip() != name:
        raise ValueError(f"unknown pattern {name!r} in {text!r}; known: {', '.join(PATTERNS)}")
    return name, checked_params(name, params)


def make_spec(text: str) -> Pattern:
    """The pattern a spec names (``kvzip[allocation=model]``)."""
    name, params = pattern_spec(text)
    return make_pattern(name, **params)


def canonical_spec(text: str) -> str:
    """The spec's canonical text: ``kvzip[allocation=head]`` is ``kvzip``."""
    return spec_label(*pattern_spec(text))


__all__ = [
    "PATTERNS",
    "LayerView",
    "Pattern",
    "PatternState",
    "canonical_spec",
    "checked_params",
    "get_pattern_class",
    "make_pattern",
    "make_spec",
    "pattern_spec",
    "spec_label",
    "split_specs",
    *[c.__name__ for c in PATTERNS.values()],
]
