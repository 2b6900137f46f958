"""Reading a strategy document: versions 1 and 2, every error naming its field.

:func:`parse_document` turns a parsed JSON document into the keyword arguments of
:class:`~strategies.strategy.Strategy` (which validates values); :func:`first_non_finite` finds a NaN
or infinity anywhere, by path. Version 1 is the layer-level file; version 2 adds the top-level
``context_len`` and ``num_kv_heads`` and lets a choice be ``{"head_groups": [...]}``
(:mod:`strategies.head_groups`).
"""

from __future__ import annotations

import math
from typing import Any

from strategies.choice import HEAD_GROUPS_VERSION, PHASES, SCHEMA_NAME, SCHEMA_VERSIONS, LayerChoice, StrategyError
from strategies.head_groups import HeadGroupError, groups_from_json

V2_KEYS = ("context_len", "num_kv_heads")


def parse_document(data: Any) -> dict[str, Any]:
    """``Strategy(**parse_document(data))``; raises :class:`StrategyError` naming the field."""
    if not isinstance(data, dict):
        raise StrategyError("strategy: the top level must be a JSON object")
    if data.get("schema") != SCHEMA_NAME:
        raise StrategyError(f"schema: expected {SCHEMA_NAME!r}, got {data.get('schema')!r}")
    version = data.get("version")
    if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
        raise StrategyError(
            f"version: unsupported schema version {version!r} (expected one of {', '.join(map(str, SCHEMA_VERSIONS))})"
        )
    if version < HEAD_GROUPS_VERSION:
        for key in V2_KEYS:
            if key in data:
                raise StrategyError(f"{key}: needs a version {HEAD_GROUPS_VERSION} file (this one says {version})")
    layers = data.get("layers")
    if not isinstance(layers, list):
        raise StrategyError("layers: must be a list")
    num_layers = data.get("num_layers", len(layers))
    if num_layers != len(layers):
        raise StrategyError(f"num_layers: says {num_layers} but layers lists {len(layers)}")
    choices: dict[str, list[LayerChoice]] = {p: [] for p in PHASES}
    for i, entry in enumerate(layers):
        if not isinstance(entry, dict):
            raise StrategyError(f"layers[{i}]: must be an object")
        if entry.get("layer", i) != i:
            raise StrategyError(f"layers[{i}].layer: expected {i}, got {entry.get('layer')!r}")
        for phase in PHASES:
            choices[phase].append(_choice(f"layers[{i}].{phase}", entry.get(phase), version))
    provenance = data.get("provenance", {})
    if not isinstance(provenance, dict):
        raise StrategyError("provenance: must be an object")
    return {
        "prefill": choices["prefill"],
        "decoding": choices["decoding"],
        "global_budget": data.get("global_budget"),
        "b_min": data.get("b_min", 1),
        "provenance": provenance,
        "context_len": data.get("context_len"),
        "num_kv_heads": data.get("num_kv_heads"),
    }


def _choice(where: str, c: Any, version: int) -> LayerChoice:
    if not isinstance(c, dict):
        raise StrategyError(f"{where}: missing or not an object")
    if "head_groups" in c:
        if version < HEAD_GROUPS_VERSION:
            raise StrategyError(
                f"{where}.head_groups: needs a version {HEAD_GROUPS_VERSION} file (this one says {version})"
            )
        unknown = set(c) - {"head_groups"}
        if unknown:
            raise StrategyError(f"{where}: a choice with head_groups has no other keys, got {sorted(unknown)}")
        try:
            return LayerChoice.grouped(groups_from_json(where, c["head_groups"]))
        except HeadGroupError as err:
            raise StrategyError(str(err)) from None
    unknown = set(c) - {"pattern", "budget", "params"}
    if unknown:
        raise StrategyError(f"{where}: unknown keys {sorted(unknown)}")
    if not isinstance(c.get("pattern"), str):
        raise StrategyError(f"{where}.pattern: must be a string")
    params = c.get("params", {})
    if not isinstance(params, dict):
        raise StrategyError(f"{where}.params: must be an object")
    return LayerChoice(c["pattern"], c.get("budget"), params)


def first_non_finite(node: Any, where: str = "strategy") -> tuple[str, float] | None:
    """The JSON path and value of the first NaN or infinity in a parsed document, if any."""
    stack = [(where, node)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path, value
        if isinstance(value, dict):
            stack.extend((_child(path, k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def _child(path: str, key: str) -> str:
    """``layers[1].prefill`` style paths; odd keys are quoted so a message stays one line."""
    if not key.isidentifier():
        return f"{path}[{key!r}]"
    return key if path == "strategy" else f"{path}.{key}"


__all__ = ["first_non_finite", "parse_document"]
