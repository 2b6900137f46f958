"""Head groups: one (layer, phase) choice split over the layer's KV heads (strategy schema version 2).

A :class:`~strategies.strategy.LayerChoice` may carry ``head_groups``: a partition of the layer's KV
heads, each group with its own pattern, params and budget, e.g. a retrieval head keeping everything
beside two streaming heads::

    "prefill": {"head_groups": [
        {"heads": [1], "pattern": "full", "budget": 1024, "params": {}},
        {"heads": [0, 2], "pattern": "streaming_llm", "budget": 48, "params": {}}]}

Budget of such a layer: the mean over its KV heads of the group budgets, each capped at the context
length the strategy was built for (``Strategy.context_len``); a group with a budget at or above it
keeps everything and counts as the context length. So ``Σ_l b_l <= L·B`` and ``b_min`` keep their
meaning (``b_min`` bounds the layer's mean, not each group). A strategy with head groups records
``num_kv_heads`` and ``context_len`` (both required) and is written as version 2.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from strategies.catalog import pattern_class
from strategies.pattern_spec import short_label

#: ``LayerChoice.pattern`` of a choice with head groups (not a registered pattern: anything that looks
#: a layer's pattern up without asking for head groups fails loudly instead of applying a wrong one).
HEAD_GROUPS = "head_groups"
GROUP_KEYS = frozenset({"heads", "pattern", "budget", "params"})


class HeadGroupError(ValueError):
    """Raised by the checks below; :mod:`strategies.strategy` turns it into a ``StrategyError``."""


@dataclass(frozen=True)
class HeadGroup:
    """Some KV heads of one layer sharing a pattern, its params and a budget (tokens kept per head)."""

    heads: tuple[int, ...]
    pattern: str
    budget: int
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.heads, list):
            object.__setattr__(self, "heads", tuple(self.heads))

    def to_json(self) -> dict[str, Any]:
        return {"heads": list(self.heads), "pattern": self.pattern, "budget": self.budget, "params": dict(self.params)}

    def label(self) -> str:
        """``streaming_llm@48[0,2]``, ``kvzip[allocation=model]@64[1]``: the parameters not at their defaults."""
        return f"{short_label(self.pattern, self.params)}@{self.budget}[{','.join(str(h) for h in self.heads)}]"


#: the pattern that keeps every token: its budget must say what it holds
KEEP_ALL = "full"


def keeps_all(budget: int, context_len: int) -> str:
    """Why a ``full`` group or layer with ``budget`` below ``context_len`` is inconsistent (one clause)."""
    return (
        f"pattern 'full' keeps every token, so it holds the whole {context_len}-token context, but its budget "
        f"says {budget} (B would count {budget}); give a budget of at least {context_len}"
    )


def mean_budget(groups: Sequence[HeadGroup], context_len: int, num_kv_heads: int) -> Fraction:
    """The layer's budget: mean over its KV heads of the group budgets capped at ``context_len``."""
    return Fraction(sum(len(g.heads) * min(g.budget, context_len) for g in groups), num_kv_heads)


def held_tokens(choice: Any, context_len: int, num_kv_heads: int | None) -> float:
    """Tokens a layer choice holds per KV head (mean over heads) after a ``context_len``-token prompt: a ``full``
    layer, head group or unbounded budget the whole context, any other budget at most the context."""

    def held(pattern: str, budget: int | None) -> int:
        return context_len if pattern == KEEP_ALL or budget is None else min(budget, context_len)

    if choice.head_groups is None:
        return held(choice.pattern, choice.budget)
    return sum(len(g.heads) * held(g.pattern, g.budget) for g in choice.head_groups) / num_kv_heads  # type: ignore[operator]


def as_number(x: Fraction) -> int | float:
    """An exact mean as a plain number: ``int`` when whole, else ``float``."""
    return int(x) if x.denominator == 1 else float(x)


def check_groups(where: str, groups: Any, num_kv_heads: int | None, context_len: int | None) -> None:
    """Raise :class:`HeadGroupError` naming the first bad field of ``groups`` (at ``where``)."""
    if num_kv_heads is None:
        raise HeadGroupError(f"num_kv_heads: required when a layer has head groups ({where})")
    if context_len is None:
        raise HeadGroupError(f"context_len: required when a layer has head groups ({where})")
    if not isinstance(groups, tuple) or not groups:
        raise HeadGroupError(f"{where}.head_groups: must be a non-empty list of groups")
    owner: dict[int, int] = {}
    for i, g in enumerate(groups):
        at = f"{where}.head_groups[{i}]"
        if not isinstance(g, HeadGroup):
            raise HeadGroupError(f"{at}: must be a HeadGroup, got {type(g).__name__}")
        if not isinstance(g.heads, tuple):
            raise HeadGroupError(f"{at}.heads: must be a list of KV head indices, got {g.heads!r}")
        if not g.heads:
            raise HeadGroupError(f"{at}.heads: empty group (a group needs at least one KV head)")
        for h in g.heads:
            if not _is_int(h):
                raise HeadGroupError(f"{at}.heads: {h!r} is not an integer KV head index")
            if not 0 <= h < num_kv_heads:
                raise HeadGroupError(f"{at}.heads: head {h} is out of range for num_kv_heads={num_kv_heads}")
            if h in owner:
                first = owner[h]
                also = "twice in this group" if first == i else f"also in head_groups[{first}]"
                raise HeadGroupError(f"{at}.heads: head {h} is repeated ({also})")
            owner[h] = i
        try:
            cls = pattern_class(g.pattern)
        except KeyError as err:
            raise HeadGroupError(f"{at}.pattern: {err.args[0]}") from None
        except TypeError:
            raise HeadGroupError(f"{at}.pattern: must be a string, got {g.pattern!r}") from None
        if not isinstance(g.params, Mapping):
            raise HeadGroupError(f"{at}.params: must be an object")
        try:
            cls(**dict(g.params))
        except (TypeError, ValueError) as err:
            raise HeadGroupError(f"{at}.params: {err}") from None
        if not _is_int(g.budget):
            raise HeadGroupError(
                f"{at}.budget: must be an integer (a group keeps everything with a budget >= context_len), "
                f"got {g.budget!r}"
            )
        if g.budget < 0:
            raise HeadGroupError(f"{at}.budget: must be non-negative, got {g.budget}")
        if g.pattern == KEEP_ALL and g.budget < context_len:
            raise HeadGroupError(f"{at}.budget: {keeps_all(g.budget, context_len)}")
    missing = [h for h in range(num_kv_heads) if h not in owner]
    if missing:
        raise HeadGroupError(
            f"{where}.head_groups: heads {missing} are in no group (every one of the {num_kv_heads} KV heads needs one)"
        )


def groups_from_json(where: str, data: Any) -> tuple[HeadGroup, ...]:
    """Parse a ``head_groups`` list (structure only; :func:`check_groups` checks the values)."""
    if not isinstance(data, list) or not data:
        raise HeadGroupError(f"{where}.head_groups: must be a non-empty list of groups")
    out = []
    for i, g in enumerate(data):
        at = f"{where}.head_groups[{i}]"
        if not isinstance(g, dict):
            raise HeadGroupError(f"{at}: must be an object")
        unknown = set(g) - GROUP_KEYS
        if unknown:
            raise HeadGroupError(f"{at}: unknown keys {sorted(unknown)}")
        for key in ("heads", "pattern", "budget"):
            if key not in g:
                raise HeadGroupError(f"{at}.{key}: missing")
        if not isinstance(g["heads"], list):
            raise HeadGroupError(f"{at}.heads: must be a list of KV head indices")
        if not isinstance(g["pattern"], str):
            raise HeadGroupError(f"{at}.pattern: must be a string")
        params = g.get("params", {})
        if not isinstance(params, dict):
            raise HeadGroupError(f"{at}.params: must be an object")
        out.append(HeadGroup(tuple(g["heads"]), g["pattern"], g["budget"], params))
    return tuple(out)


def group_heads(
    per_head: Sequence[tuple[str, int, Mapping[str, Any]]],
    alone: Callable[[str, Mapping[str, Any]], bool] | None = None,
) -> tuple[HeadGroup, ...]:
    """Head groups from one ``(pattern, budget, params)`` per KV head: heads with equal choices share a
    group, except those for which ``alone(pattern, params)`` is true (a pooled pattern's cells are single KV
    heads), which get a group each; groups are ordered by their first head."""
    groups: dict[tuple[str, int, tuple[tuple[str, Any], ...], int | None], list[int]] = {}
    for h, (pattern, budget, params) in enumerate(per_head):
        own = h if alone is not None and alone(pattern, params) else None  # a head in a group of its own
        groups.setdefault((pattern, int(budget), tuple(sorted(dict(params).items())), own), []).append(h)
    return tuple(HeadGroup(tuple(heads), key[0], key[1], dict(key[2])) for key, heads in groups.items())


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


__all__ = [
    "HEAD_GROUPS",
    "HeadGroup",
    "HeadGroupError",
    "as_number",
    "check_groups",
    "group_heads",
    "groups_from_json",
    "mean_budget",
]
