"""The shared eviction runtime: apply a strategy to a loaded HF causal LM."""

from polykv_search.runtime.architectures import SUPPORTED, UnsupportedModelError, model_spec
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.fanout import fanout_layer
from polykv_search.runtime.layer import FULL_PLAN, EvictingLayer, PhasePlan, eviction_target
from polykv_search.runtime.layouts import GroupedLayer, HeadGroupPlan, KernelGroup, row_batch
from polykv_search.runtime.report import CacheReport, LayerReport, cache_report
from polykv_search.runtime.runtime import PolyKVCache, PolyKVRuntime, apply_strategy, strategy_plans

__all__ = [
    "SUPPORTED",
    "CacheReport",
    "EvictingLayer",
    "FULL_PLAN",
    "GroupedLayer",
    "HeadGroupPlan",
    "KernelGroup",
    "LayerReport",
    "PhasePlan",
    "PolyKVCache",
    "PolyKVRuntime",
    "RuntimeLayer",
    "UnsupportedModelError",
    "apply_strategy",
    "cache_report",
    "eviction_target",
    "fanout_layer",
    "model_spec",
    "row_batch",
    "strategy_plans",
]
