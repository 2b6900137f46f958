"""A pattern's spec text, ``name`` or ``name[k=v,...]``, as strategies print it (parsed by
:mod:`polykv_search.patterns.spec`, one layer up)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strategies.catalog import pattern_class


def spec_label(name: str, params: Mapping[str, Any]) -> str:
    """``name`` alone, or ``name[k=v,...]`` (a pattern spec, :mod:`polykv_search.patterns.spec`)."""
    if not params:
        return name
    text = (param_text(v) for v in params.values())
    return f"{name}[{','.join(f'{k}={v}' for k, v in zip(params, text))}]"


def param_text(value: Any) -> str:
    """A parameter as spec text: ``true``, ``64``, or one value per KV head joined by ``/`` (``2/0.5/1``)."""
    if isinstance(value, (list, tuple)):
        return "/".join(param_text(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def short_label(name: str, params: Mapping[str, Any]) -> str:
    """:func:`spec_label` without the parameters at the pattern's defaults (``streaming_llm``, not
    ``streaming_llm[n_sink=4]``); an unknown pattern keeps them all."""
    try:
        defaults = pattern_class(name)().params()
    except (KeyError, TypeError, ValueError):
        defaults = {}
    return spec_label(name, {k: v for k, v in params.items() if k not in defaults or defaults[k] != v})


__all__ = ["param_text", "short_label", "spec_label"]
