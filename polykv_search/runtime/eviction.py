"""What a layer applies in each phase (:class:`PhasePlan`), and when and how far it evicts.

:func:`eviction_target` is the one statement of the eviction rule; the runtime's layers, the
row-batched layer and the tests' oracle all call it.
"""

from __future__ import annotations

from dataclasses import dataclass

from polykv_search.patterns import make_pattern
from polykv_search.patterns.base import Pattern
from strategies import PHASES

PREFILL, DECODING = PHASES

#: How ``decode_interval = k`` evicts: ``"within"`` keeps every layer at or below its budget (it evicts
#: down to ``budget - k + 1`` once over it); ``"over"`` lets it hold up to ``budget + k - 1`` tokens.
INTERVAL_MODES = ("within", "over")


@dataclass(frozen=True)
class PhasePlan:
    """The pattern and budget a layer applies in one phase (``budget=None``: keep all)."""

    pattern: Pattern
    budget: int | None

    @property
    def evicts(self) -> bool:
        return self.budget is not None and not self.pattern.keeps_all


#: The no-eviction plan.
FULL_PLAN = PhasePlan(make_pattern("full"), None)


def eviction_target(
    phase: str, length: int, budget: int | None, *, interval: int, mode: str, steps_since_eviction: int
) -> int | None:
    """How many tokens a layer keeps after an attention call, or None when it does not evict.

    ``length``: tokens held now; ``budget``: the phase's budget (None: keep all);
    ``steps_since_eviction``: decoding steps since the layer last evicted, this one included.
    Prefill compresses to the budget. Decoding, once over the budget: mode ``"within"`` evicts at once,
    down to ``budget - k + 1`` (``k = interval``; at least 1) so the next ``k - 1`` steps fit;
    mode ``"over"`` evicts down to the budget once ``k`` steps have passed.
    """
    if budget is None or length <= budget:
        return None
    if phase == PREFILL:
        return budget
    if mode == "within":
        return budget - min(interval, budget) + 1
    return budget if steps_since_eviction >= interval else None
