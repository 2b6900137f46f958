"""The shared eviction runtime: apply a strategy to a loaded HF causal LM."""

from polykv_search.runtime.architectures import SUPPORTED, UnsupportedModelError, model_spec
from polykv_search.runtime.layer import FULL_PLAN, EvictingLayer, PhasePlan
from polykv_search.runtime.report import CacheReport, LayerReport, cache_report
from polykv_search.runtime.row_batch import RowBatchLayer
from polykv_search.runtime.runtime import PolyKVCache, PolyKVRuntime, apply_strategy, strategy_plans
from polykv_search.runtime.stacked import FanoutLayer, StackedLayer

__all__ = [
    "SUPPORTED",
    "CacheReport",
    "EvictingLayer",
    "FULL_PLAN",
    "FanoutLayer",
    "LayerReport",
    "PhasePlan",
    "PolyKVCache",
    "PolyKVRuntime",
    "RowBatchLayer",
    "StackedLayer",
    "UnsupportedModelError",
    "apply_strategy",
    "cache_report",
    "model_spec",
    "strategy_plans",
]
