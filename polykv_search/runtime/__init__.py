"""The shared eviction runtime: apply a strategy to a loaded HF causal LM."""

from polykv_search.runtime.architectures import SUPPORTED, UnsupportedModelError, model_spec
from polykv_search.runtime.layer import EvictingLayer, PhasePlan
from polykv_search.runtime.report import CacheReport, LayerReport
from polykv_search.runtime.runtime import PolyKVCache, PolyKVRuntime, apply_strategy

__all__ = [
    "SUPPORTED",
    "CacheReport",
    "EvictingLayer",
    "LayerReport",
    "PhasePlan",
    "PolyKVCache",
    "PolyKVRuntime",
    "UnsupportedModelError",
    "apply_strategy",
    "model_spec",
]
