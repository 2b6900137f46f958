"""A layer view that raises on anything outside :class:`~polykv_search.patterns.base.LayerView`, and patterns
that see layers only through it: the checked pattern–layer boundary (tests/test_layer_view_conformance.py)."""

from __future__ import annotations

import inspect
from typing import Any

from polykv_search.patterns import PATTERNS, LayerView, Pattern

#: Every name the protocol declares: its attributes and its methods and properties.
LAYER_VIEW_NAMES = frozenset(
    [*LayerView.__annotations__, *(n for n, v in vars(LayerView).items() if not n.startswith("_") and callable(v))]
    + [n for n, v in vars(LayerView).items() if isinstance(v, property)]
)


class OutsideLayerView(AttributeError):
    """A pattern read a layer attribute that :class:`LayerView` does not declare."""


class StrictView:
    """``layer`` as a pattern may read it: the :class:`LayerView` names, and nothing else (read-only)."""

    __slots__ = ("_layer",)

    def __init__(self, layer: Any):
        object.__setattr__(self, "_layer", layer)

    def __getattr__(self, name: str) -> Any:
        if name not in LAYER_VIEW_NAMES:
            layer = object.__getattribute__(self, "_layer")
            raise OutsideLayerView(f"a pattern read {type(layer).__name__}.{name}, which LayerView does not declare")
        return getattr(object.__getattribute__(self, "_layer"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise OutsideLayerView(f"a pattern set layer attribute {name!r}: LayerView is read-only")


def strict(layer: Any) -> StrictView:
    return layer if isinstance(layer, StrictView) else StrictView(layer)


#: The hook points and building blocks through which a pattern is handed a layer (argument 1).
LAYER_METHODS = (
    "pre_kernel",
    "post_kernel",
    "cache_update",
    "cache_update_rows",
    "selection_key",
    "score",
    "protected",
    "reconstruct",
)


def checked_class(cls: type[Pattern]) -> type[Pattern]:
    """A subclass of pattern class ``cls`` whose every layer-taking method sees the layer as a :class:`StrictView`
    (same name, parameters, flags and equality; the default batched variant stays the default one, so the
    runtime takes the same paths)."""
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": f"Checked{cls.__name__}"}
    for name in LAYER_METHODS:
        method = getattr(cls, name)
        if name == "cache_update_rows" and method is Pattern.cache_update_rows:
            namespace[name] = method  # the runtime recognises the default variant by identity
            continue

        def wrapped(self, layer, *args, _method=method, **kwargs):
            return _method(self, strict(layer), *args, **kwargs)

        wrapped.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
        namespace[name] = wrapped
    return type(f"Checked{cls.__name__}", (cls,), namespace)


def checked_patterns(monkeypatch) -> list[str]:
    """Register a checked subclass in place of every registered pattern; returns their names."""
    names = list(PATTERNS)
    for name in names:
        monkeypatch.setitem(PATTERNS, name, checked_class(PATTERNS[name]))
    return names
