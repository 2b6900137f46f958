"""Strategy type, JSON schema and validation, and exporters to other runtimes."""

from strategies.strategy import PHASES, SCHEMA_VERSION, LayerChoice, Strategy, StrategyError

__all__ = ["PHASES", "SCHEMA_VERSION", "LayerChoice", "Strategy", "StrategyError"]
