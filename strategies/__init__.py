"""Strategy type, JSON schema and validation, atomic I/O, and exporters to other runtimes.

The bottom layer: it imports no other first-party package (the eviction patterns it validates
against are registered by the core, see :mod:`strategies.catalog`).
"""

from strategies.strategy import HEAD_GROUPS, PHASES, SCHEMA_VERSION, HeadGroup, LayerChoice, Strategy, StrategyError

__all__ = ["HEAD_GROUPS", "PHASES", "SCHEMA_VERSION", "HeadGroup", "LayerChoice", "Strategy", "StrategyError"]
