"""One layer's choice in one phase (:class:`LayerChoice`), the phases, and :class:`StrategyError`.

Re-exported by :mod:`strategies.strategy`, their usual import path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strategies.head_groups import HEAD_GROUPS, HeadGroup
from strategies.pattern_spec import spec_label

PHASES: tuple[str, ...] = ("prefill", "decoding")
SCHEMA_NAME = "polykv-strategy"
#: Version written for layer-level strategies (unchanged files); head groups are written as version 2.
SCHEMA_VERSION = 1
HEAD_GROUPS_VERSION = 2
SCHEMA_VERSIONS = (1, 2)


class StrategyError(ValueError):
    """A strategy file or object that breaks the schema or the budget constraints."""


@dataclass(frozen=True)
class LayerChoice:
    """What one layer does in one phase.

    ``budget`` is the number of tokens kept per KV head (sinks and protected windows count inside
    it); ``None`` means unbounded and is only valid with the ``full`` pattern.

    ``head_groups`` (schema version 2; build with :meth:`grouped`) splits the layer's KV heads into
    groups with their own pattern, params and budget (:mod:`strategies.head_groups`). Such a choice
    has ``pattern == "head_groups"`` (not a pattern) and, once in a :class:`Strategy`, ``budget`` =
    the mean over KV heads of the group budgets capped at the strategy's ``context_len``.
    """

    pattern: str
    budget: int | float | None
    params: Mapping[str, Any] = field(default_factory=dict)
    head_groups: tuple[HeadGroup, ...] | None = None

    @classmethod
    def grouped(cls, groups: Iterable[HeadGroup]) -> LayerChoice:
        """A choice with head groups (its budget is filled in by the :class:`Strategy` it joins)."""
        return cls(HEAD_GROUPS, None, {}, tuple(groups))

    @property
    def has_head_groups(self) -> bool:
        return self.head_groups is not None

    def label(self) -> str:
        """``snapkv@64``, ``kvzip[allocation=model]@64`` with parameters, or ``full@1024[1] + streaming_llm@48[0,2]``
        for head groups."""
        if self.head_groups is None:
            return f"{spec_label(self.pattern, self.params)}@{self.budget}"
        return " + ".join(g.label() for g in self.head_groups)

    def to_json(self) -> dict[str, Any]:
        if self.head_groups is not None:
            return {"head_groups": [g.to_json() for g in self.head_groups]}
        return {"pattern": self.pattern, "budget": self.budget, "params": dict(self.params)}


__all__ = [
    "HEAD_GROUPS_VERSION",
    "PHASES",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "LayerChoice",
    "StrategyError",
    "spec_label",
]
