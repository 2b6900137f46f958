"""A pattern's spec text, ``name`` or ``name[k=v,...]``, as strategies print it (parsed by
:mod:`polykv_search.patterns.spec`, one layer up)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def spec_label(name: str, params: Mapping[str, Any]) -> str:
    """``name`` alone, or ``name[k=v,...]`` (a pattern spec, :mod:`polykv_search.patterns.spec`)."""
    if not params:
        return name
    text = (str(v).lower() if isinstance(v, bool) else str(v) for v in params.values())
    return f"{name}[{','.join(f'{k}={v}' for k, v in zip(params, text))}]"


__all__ = ["spec_label"]
