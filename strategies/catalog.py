"""The pattern catalog: how the bottom layer learns which eviction patterns exist.

``strategies`` is the bottom layer and may not import the patterns (``polykv_search.patterns``,
one layer up), yet a strategy is valid only when each layer's pattern name and parameters are, and
the exporters need each pattern's parameters with their defaults filled in. So the dependency is
inverted: the core registers its lookup here (:func:`register_pattern_catalog`) when
``polykv_search`` is imported, and strategies asks this module. Everything in the project that builds
or reads strategies imports the core (the runtime, solvers, signals, the CLI; ``tests/conftest.py``
for the tests); a process that imports only ``strategies`` gets a :class:`MissingCatalogError` that
says what to import, never a strategy that skipped its checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class PatternLike(Protocol):
    """What strategies reads from a pattern instance."""

    def params(self) -> dict[str, Any]: ...


#: ``name -> pattern class``; raises ``KeyError`` (naming the known patterns) for an unknown name.
#: Calling the class with a layer's params validates them (``TypeError``/``ValueError``).
PatternLookup = Callable[[str], Callable[..., PatternLike]]


class MissingCatalogError(RuntimeError):
    """No pattern catalog was registered: a programming error, not bad input."""


_lookup: PatternLookup | None = None


def register_pattern_catalog(lookup: PatternLookup) -> None:
    """Make ``lookup`` the catalog strategies validate against (``polykv_search/__init__.py`` calls this)."""
    global _lookup
    _lookup = lookup


def pattern_class(name: str) -> Callable[..., PatternLike]:
    """The class of pattern ``name``; ``KeyError`` for an unknown name."""
    if _lookup is None:
        raise MissingCatalogError(
            "strategies: no pattern catalog is registered; import polykv_search first "
            "(it registers the eviction patterns that strategies are checked against)"
        )
    return _lookup(name)


def make_pattern(name: str, **params: Any) -> Any:
    """An instance of pattern ``name`` with ``params`` (validated by the pattern itself)."""
    return pattern_class(name)(**params)


__all__ = ["MissingCatalogError", "PatternLookup", "make_pattern", "pattern_class", "register_pattern_catalog"]
