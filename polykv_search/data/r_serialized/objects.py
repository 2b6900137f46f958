"""What the reader returns: :class:`RObject`, one decoded R object, and :class:`RDataError`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polykv_search.data.errors import DataError


class RDataError(DataError):
    """The bytes are not R serialized data this reader understands."""


@dataclass
class RObject:
    """One decoded R object.

    Attributes
    ----------
    type : str
        R's ``typeof()`` name (``"character"``, ``"integer"``, ``"list"``, ``"pairlist"``, ...).
    value : Any
        Atomic vectors: a ``list`` (``None`` for NA); lists: a ``list`` of ``RObject``;
        pairlists: a ``list`` of ``(tag or None, RObject)``; symbols: the name; raw: ``bytes``.
    attributes : dict[str, RObject]
        R attributes by name (``names``, ``class``, ``row.names``, ...).
    """

    type: str
    value: Any = None
    attributes: dict[str, RObject] = field(default_factory=dict)

    @property
    def names(self) -> list[str] | None:
        """The ``names`` attribute as Python strings, or ``None``."""
        names = self.attributes.get("names")
        return None if names is None else list(names.value)

    def to_python(self) -> Any:
        """Plain Python data: named lists become ``dict``, vectors ``list``, NULL ``None``."""
        if self.type == "NULL":
            return None
        if self.type in ("list", "expression"):
            items = [v.to_python() for v in self.value]
            names = self.names
            return dict(zip(names, items)) if names and len(names) == len(items) else items
        if self.type == "pairlist":
            if all(tag is not None for tag, _ in self.value):
                return {tag: v.to_python() for tag, v in self.value}
            return [v.to_python() for _, v in self.value]
        if self.type in ("character", "integer", "double", "logical", "complex"):
            names = self.names
            if names and len(names) == len(self.value):
                return dict(zip(names, self.value))
            return list(self.value)
        return self.value
