"""The `Strategy` type: one (pattern, params, budget) choice per layer and phase, plus provenance.

A strategy is what every solver returns, what the runtime applies and what the exporters translate.
It is serialized as versioned JSON (``schema: polykv-strategy``); :meth:`Strategy.validate` names the
offending field in every error.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strategies.catalog import pattern_class
from strategies.io import atomic_write_text

PHASES: tuple[str, ...] = ("prefill", "decoding")
SCHEMA_NAME = "polykv-strategy"
SCHEMA_VERSION = 1


class StrategyError(ValueError):
    """A strategy file or object that breaks the schema or the budget constraints."""


@dataclass(frozen=True)
class LayerChoice:
    """What one layer does in one phase.

    ``budget`` is the number of tokens kept per KV head (sinks and protected windows count inside
    it); ``None`` means unbounded and is only valid with the ``full`` pattern.
    """

    pattern: str
    budget: int | None
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "budget": self.budget, "params": dict(self.params)}


@dataclass
class Strategy:
    """A layer-wise eviction strategy Π = {(l, φ) → (pattern, params, budget)}.

    Parameters
    ----------
    prefill, decoding
        One :class:`LayerChoice` per layer, in layer order.
    global_budget
        B, the average budget per layer; per phase Σ_l b_l ≤ L·B. ``None`` for unconstrained
        strategies (FullKV).
    b_min
        Smallest budget any layer may get.
    provenance
        Free-form record of how the strategy was made (model, solver, settings, signals hash, ...).
    """

    prefill: list[LayerChoice]
    decoding: list[LayerChoice]
    global_budget: float | None = None
    b_min: int = 1
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ access
    @property
    def num_layers(self) -> int:
        return len(self.prefill)

    def phase(self, phase: str) -> list[LayerChoice]:
        if phase not in PHASES:
            raise StrategyError(f"phase: {phase!r} is not one of {PHASES}")
        return self.prefill if phase == "prefill" else self.decoding

    def budgets(self, phase: str) -> list[int | None]:
        return [c.budget for c in self.phase(phase)]

    def patterns(self, phase: str) -> list[str]:
        return [c.pattern for c in self.phase(phase)]

    @property
    def is_full(self) -> bool:
        return all(c.budget is None for p in PHASES for c in self.phase(p))

    # -------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise :class:`StrategyError` naming the first offending field."""
        if len(self.prefill) == 0:
            raise StrategyError("layers: a strategy needs at least one layer")
        if len(self.prefill) != len(self.decoding):
            raise StrategyError(f"layers: prefill has {len(self.prefill)} layers but decoding has {len(self.decoding)}")
        if not _is_int(self.b_min) or self.b_min < 1:
            raise StrategyError(f"b_min: must be a positive integer, got {self.b_min!r}")
        B = self.global_budget
        if B is not None:
            if isinstance(B, bool) or not isinstance(B, (int, float)) or not math.isfinite(B) or B < 1:
                raise StrategyError(f"global_budget: must be a number >= 1 or null, got {B!r}")
            if self.b_min > B:
                raise StrategyError(f"b_min: {self.b_min} exceeds global_budget {B}: infeasible")
        for phase in PHASES:
            total = 0
            for layer, choice in enumerate(self.phase(phase)):
                where = f"layers[{layer}].{phase}"
                try:
                    cls = pattern_class(choice.pattern)
                except KeyError as err:
                    raise StrategyError(f"{where}.pattern: {err.args[0]}") from None
                try:
                    cls(**dict(choice.params))
                except (TypeError, ValueError) as err:
                    raise StrategyError(f"{where}.params: {err}") from None
                b = choice.budget
                if b is None:
                    if choice.pattern != "full":
                        raise StrategyError(f"{where}.budget: null (unbounded) is only valid with pattern 'full'")
                    if B is not None:
                        raise StrategyError(
                            f"{where}.budget: null (unbounded) is not allowed when global_budget is set"
                        )
                    continue
                if not _is_int(b):
                    raise StrategyError(f"{where}.budget: must be an integer, got {b!r}")
                if b < 0:
                    raise StrategyError(f"{where}.budget: must be non-negative, got {b}")
                if b < self.b_min:
                    raise StrategyError(f"{where}.budget: {b} is below b_min={self.b_min}")
                total += b
            if B is not None and total > self.num_layers * B + 1e-9:
                raise StrategyError(
                    f"{phase}: budgets sum to {total}, over L*B = {self.num_layers}*{B} = {self.num_layers * B:g}"
                )

    def check_model(self, num_layers: int) -> None:
        """Raise if this strategy does not fit a model with ``num_layers`` layers."""
        if num_layers != self.num_layers:
            raise StrategyError(f"layers: strategy has {self.num_layers} layers but the model has {num_layers}")

    # --------------------------------------------------------------- builders
    @classmethod
    def full(cls, num_layers: int, **provenance: Any) -> Strategy:
        """FullKV: no eviction in any layer."""
        choices = [LayerChoice("full", None) for _ in range(num_layers)]
        return cls(list(choices), list(choices), None, 1, {"solver": "full", **provenance})

    @classmethod
    def uniform(
        cls,
        num_layers: int,
        pattern: str,
        budget: int,
        *,
        params: Mapping[str, Any] | None = None,
        b_min: int = 1,
        **provenance: Any,
    ) -> Strategy:
        """uniform-X: ``pattern`` with ``budget`` in every layer and both phases (B = budget)."""
        if pattern == "full":
            return cls.full(num_layers, **provenance)
        choice = LayerChoice(pattern, int(budget), dict(params or {}))
        return cls(
            [choice] * num_layers,
            [choice] * num_layers,
            float(budget),
            int(b_min),
            {"solver": "uniform", "pattern": pattern, **provenance},
        )

    @classmethod
    def from_choices(
        cls,
        prefill: Iterable[tuple[str, int | None]] | Iterable[LayerChoice],
        decoding: Iterable[tuple[str, int | None]] | Iterable[LayerChoice],
        global_budget: float | None,
        b_min: int = 1,
        **provenance: Any,
    ) -> Strategy:
        """Build from ``(pattern, budget)`` pairs (or :class:`LayerChoice` objects) per layer."""

        def norm(items):
            return [c if isinstance(c, LayerChoice) else LayerChoice(c[0], c[1]) for c in items]

        return cls(norm(prefill), norm(decoding), global_budget, b_min, dict(provenance))

    # ------------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_NAME,
            "version": SCHEMA_VERSION,
            "num_layers": self.num_layers,
            "global_budget": self.global_budget,
            "b_min": self.b_min,
            "layers": [
                {"layer": i, "prefill": p.to_json(), "decoding": d.to_json()}
                for i, (p, d) in enumerate(zip(self.prefill, self.decoding))
            ],
            "provenance": self.provenance,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False, allow_nan=False) + "\n"

    def digest(self) -> str:
        """A short hash of the strategy's content (provenance excluded)."""
        body = self.to_json()
        body.pop("provenance")
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(path, self.dumps())

    @classmethod
    def from_json(cls, data: Any) -> Strategy:
        if not isinstance(data, dict):
            raise StrategyError("strategy: the top level must be a JSON object")
        if data.get("schema") != SCHEMA_NAME:
            raise StrategyError(f"schema: expected {SCHEMA_NAME!r}, got {data.get('schema')!r}")
        if data.get("version") != SCHEMA_VERSION:
            raise StrategyError(
                f"version: unsupported schema version {data.get('version')!r} (expected {SCHEMA_VERSION})"
            )
        layers = data.get("layers")
        if not isinstance(layers, list):
            raise StrategyError("layers: must be a list")
        num_layers = data.get("num_layers", len(layers))
        if num_layers != len(layers):
            raise StrategyError(f"num_layers: says {num_layers} but layers lists {len(layers)}")
        choices: dict[str, list[LayerChoice]] = {p: [] for p in PHASES}
        for i, entry in enumerate(layers):
            if not isinstance(entry, dict):
                raise StrategyError(f"layers[{i}]: must be an object")
            if entry.get("layer", i) != i:
                raise StrategyError(f"layers[{i}].layer: expected {i}, got {entry.get('layer')!r}")
            for phase in PHASES:
                c = entry.get(phase)
                if not isinstance(c, dict):
                    raise StrategyError(f"layers[{i}].{phase}: missing or not an object")
                unknown = set(c) - {"pattern", "budget", "params"}
                if unknown:
                    raise StrategyError(f"layers[{i}].{phase}: unknown keys {sorted(unknown)}")
                if not isinstance(c.get("pattern"), str):
                    raise StrategyError(f"layers[{i}].{phase}.pattern: must be a string")
                params = c.get("params", {})
                if not isinstance(params, dict):
                    raise StrategyError(f"layers[{i}].{phase}.params: must be an object")
                choices[phase].append(LayerChoice(c["pattern"], c.get("budget"), params))
        provenance = data.get("provenance", {})
        if not isinstance(provenance, dict):
            raise StrategyError("provenance: must be an object")
        b_min = data.get("b_min", 1)
        return cls(choices["prefill"], choices["decoding"], data.get("global_budget"), b_min, provenance)

    @classmethod
    def loads(cls, text: str) -> Strategy:
        """Parse and validate a strategy document; NaN and infinities anywhere are refused by path."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise StrategyError(f"strategy: not valid JSON ({err})") from None
        except RecursionError:
            raise StrategyError("strategy: JSON nested too deeply") from None
        where = _first_non_finite(data)
        if where is not None:
            raise StrategyError(f"{where[0]}: {where[1]!r} is not a finite number")
        return cls.from_json(data)

    @classmethod
    def load(cls, path: str | Path) -> Strategy:
        """Read ``path`` (UTF-8 JSON); every error names the file: ``PATH: field: what is wrong``."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise StrategyError(f"strategy {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        except OSError as err:
            raise StrategyError(f"strategy: cannot read {path}: {err.strerror or err}") from None
        try:
            return cls.loads(text)
        except StrategyError as err:
            raise StrategyError(f"strategy {path}: {err}") from None


def _first_non_finite(node: Any, where: str = "strategy") -> tuple[str, float] | None:
    """The JSON path and value of the first NaN or infinity in a parsed document, if any."""
    stack = [(where, node)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path, value
        if isinstance(value, dict):
            stack.extend((_child(path, k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def _child(path: str, key: str) -> str:
    """``layers[1].prefill`` style paths; odd keys are quoted so a message stays one line."""
    if not key.isidentifier():
        return f"{path}[{key!r}]"
    return key if path == "strategy" else f"{path}.{key}"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


__all__ = ["PHASES", "LayerChoice", "Strategy", "StrategyError", "SCHEMA_VERSION"]
