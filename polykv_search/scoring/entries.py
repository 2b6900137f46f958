"""What ``score`` scores: entries (a strategy with a display name); the CLI builds the baselines
(:mod:`polykv_search.cli.baselines`) and passes them in as entries."""

from __future__ import annotations

from dataclasses import dataclass

from strategies import Strategy


class ScoreError(ValueError):
    """Bad scoring input (unknown baseline, missing budget, ...)."""


@dataclass
class Entry:
    """One thing to score: a strategy with a display name."""

    name: str
    strategy: Strategy
    kind: str  # "baseline" or "strategy"
    source: str
