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
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeGuard

from strategies.catalog import pattern_class
from strategies.choice import (
    HEAD_GROUPS_VERSION,
    PHASES,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    LayerChoice,
    StrategyError,
)
from strategies.head_groups import (
    HEAD_GROUPS,
    KEEP_ALL,
    HeadGroup,
    HeadGroupError,
    as_number,
    check_groups,
    keeps_all,
    mean_budget,
)
from strategies.io import atomic_write_text, read_text
from strategies.strategy_json import first_non_finite, parse_document


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
    context_len
        The context length the strategy was built for; required with head groups (a group's budget
        counts at most this much). Written only in version-2 files.
    num_kv_heads
        KV heads per layer; required with head groups (checked by :meth:`check_model`).
    """

    prefill: list[LayerChoice]
    decoding: list[LayerChoice]
    global_budget: float | None = None
    b_min: int = 1
    provenance: dict[str, Any] = field(default_factory=dict)
    context_len: int | None = None
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        self.prefill, self.decoding = list(self.prefill), list(self.decoding)
        self.validate()
        for phase in PHASES:  # a grouped choice's budget: the layer's mean, for readers of .budget
            choices = self.phase(phase)
            for layer, c in enumerate(choices):
                if c.head_groups is not None:
                    b = as_number(mean_budget(c.head_groups, self.context_len, self.num_kv_heads))  # type: ignore[arg-type]
                    choices[layer] = LayerChoice(HEAD_GROUPS, b, {}, c.head_groups)

    # ------------------------------------------------------------------ access
    @property
    def num_layers(self) -> int:
        return len(self.prefill)

    def phase(self, phase: str) -> list[LayerChoice]:
        if phase not in PHASES:
            raise StrategyError(f"phase: {phase!r} is not one of {PHASES}")
        return self.prefill if phase == "prefill" else self.decoding

    def budgets(self, phase: str) -> list[int | float | None]:
        return [c.budget for c in self.phase(phase)]

    def patterns(self, phase: str) -> list[str]:
        return [c.pattern for c in self.phase(phase)]

    @property
    def is_full(self) -> bool:
        return all(c.budget is None and c.head_groups is None for p in PHASES for c in self.phase(p))

    # ------------------------------------------------------------ head groups
    @property
    def has_head_groups(self) -> bool:
        """True when any (layer, phase) splits its KV heads into groups (a version-2 strategy)."""
        return any(c.head_groups is not None for p in PHASES for c in self.phase(p))

    def head_groups(self, layer: int, phase: str) -> tuple[HeadGroup, ...] | None:
        """The head groups of ``(layer, phase)`` (each: ``heads``, ``pattern``, ``params``, ``budget``),
        or ``None`` when that layer makes one layer-level choice (read ``phase(phase)[layer]``)."""
        return self.phase(phase)[layer].head_groups

    def first_head_groups(self) -> str | None:
        """``layers[3].prefill``: where the first head groups are, or None."""
        for layer in range(self.num_layers):
            for phase in PHASES:
                if self.phase(phase)[layer].head_groups is not None:
                    return f"layers[{layer}].{phase}"
        return None

    def require_layer_level(self, consumer: str) -> None:
        """Raise :class:`StrategyError` if ``consumer`` (which applies layer-level strategies only) got head groups."""
        where = self.first_head_groups()
        if where is not None:
            raise StrategyError(
                f"{where}.head_groups: {consumer} cannot apply head-level strategies yet "
                "(this strategy has head groups); export it with --format json or score layer-level strategies"
            )

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
        for name in ("context_len", "num_kv_heads"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise StrategyError(f"{name}: must be a positive integer or null, got {value!r}")
        for phase in PHASES:
            total = Fraction(0)
            for layer, choice in enumerate(self.phase(phase)):
                where = f"layers[{layer}].{phase}"
                if not isinstance(choice, LayerChoice):
                    raise StrategyError(f"{where}: must be a LayerChoice, got {type(choice).__name__}")
                if choice.head_groups is not None:
                    total += self._check_grouped(where, choice)
                    continue
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
                if choice.pattern == KEEP_ALL and self.context_len is not None and b < self.context_len:
                    raise StrategyError(f"{where}.budget: {keeps_all(b, self.context_len)}")
                total += b
            if B is not None and total > self.num_layers * Fraction(B) + Fraction(1, 10**9):
                raise StrategyError(
                    f"{phase}: budgets sum to {as_number(total)}, over L*B = {self.num_layers}*{B} = "
                    f"{self.num_layers * B:g}"
                )

    def _check_grouped(self, where: str, choice: LayerChoice) -> Fraction:
        """Check one choice with head groups; returns the layer's budget (the capped mean)."""
        if choice.pattern != HEAD_GROUPS:
            raise StrategyError(f"{where}.pattern: a choice with head_groups has pattern {HEAD_GROUPS!r}")
        try:
            check_groups(where, choice.head_groups, self.num_kv_heads, self.context_len)
        except HeadGroupError as err:
            raise StrategyError(str(err)) from None
        mean = mean_budget(choice.head_groups, self.context_len, self.num_kv_heads)  # type: ignore[arg-type]
        if choice.budget is not None and choice.budget != as_number(mean):  # filled in by __post_init__
            raise StrategyError(f"{where}.budget: {choice.budget} is not the mean of its head groups ({float(mean):g})")
        if mean < self.b_min:
            raise StrategyError(f"{where}.head_groups: mean budget {float(mean):g} is below b_min={self.b_min}")
        return mean

    def check_model(self, num_layers: int, num_kv_heads: int | None = None) -> None:
        """Raise if this strategy does not fit a model with ``num_layers`` layers (and, for a strategy
        with head groups, ``num_kv_heads`` KV heads per layer: required then, so a caller that does
        not pass it, i.e. that cannot apply head groups, refuses them)."""
        if num_layers != self.num_layers:
            raise StrategyError(f"layers: strategy has {self.num_layers} layers but the model has {num_layers}")
        if num_kv_heads is not None:
            self._check_per_head_params(num_kv_heads)
        where = self.first_head_groups()
        if where is None:
            return
        if num_kv_heads is None:
            raise StrategyError(
                f"{where}.head_groups: this runtime cannot apply head-level strategies yet (it does not check "
                "KV heads); use a layer-level strategy"
            )
        if num_kv_heads != self.num_kv_heads:
            raise StrategyError(
                f"num_kv_heads: strategy has head groups over {self.num_kv_heads} KV heads but the model has "
                f"{num_kv_heads}"
            )

    def _check_per_head_params(self, num_kv_heads: int) -> None:
        """A parameter given as a list (kvzip's pool prior per KV head) has one value per KV head of the layer,
        in a head group too (the group's heads pick theirs)."""
        for phase in PHASES:
            for layer, choice in enumerate(self.phase(phase)):
                parts = [(choice.params, "")] if choice.head_groups is None else []
                parts += [(g.params, f".head_groups[{i}]") for i, g in enumerate(choice.head_groups or ())]
                for params, where in parts:
                    for key, value in params.items():
                        if isinstance(value, (list, tuple)) and len(value) != num_kv_heads:
                            raise StrategyError(
                                f"layers[{layer}].{phase}{where}.params.{key}: {len(value)} values, one per KV head, "
                                f"but the model has {num_kv_heads} KV heads"
                            )

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
    @property
    def version(self) -> int:
        """The schema version this strategy is written as: 2 with head groups (or a recorded
        ``context_len``/``num_kv_heads``), else 1, so layer-level files stay byte-identical."""
        v2 = self.has_head_groups or self.context_len is not None or self.num_kv_heads is not None
        return HEAD_GROUPS_VERSION if v2 else SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": SCHEMA_NAME,
            "version": self.version,
            "num_layers": self.num_layers,
            "global_budget": self.global_budget,
            "b_min": self.b_min,
        }
        for key in ("context_len", "num_kv_heads"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        doc["layers"] = [
            {"layer": i, "prefill": p.to_json(), "decoding": d.to_json()}
            for i, (p, d) in enumerate(zip(self.prefill, self.decoding))
        ]
        doc["provenance"] = self.provenance
        return doc

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
        """Build and validate from a parsed document (version 1 or 2); errors name the field."""
        return cls(**parse_document(data))

    @classmethod
    def loads(cls, text: str) -> Strategy:
        """Parse and validate a strategy document; NaN and infinities anywhere are refused by path."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise StrategyError(f"strategy: not valid JSON ({err})") from None
        except RecursionError:
            raise StrategyError("strategy: JSON nested too deeply") from None
        where = first_non_finite(data)
        if where is not None:
            raise StrategyError(f"{where[0]}: {where[1]!r} is not a finite number")
        return cls.from_json(data)

    @classmethod
    def load(cls, path: str | Path) -> Strategy:
        """Read ``path`` (UTF-8 JSON, or ``.json.xz`` / ``.json.gz``); every error names the file: ``PATH: field:
        what is wrong``."""
        path = Path(path)
        try:
            text = read_text(path)
        except UnicodeDecodeError as err:
            raise StrategyError(f"strategy {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        except OSError as err:
            raise StrategyError(f"strategy: cannot read {path}: {err.strerror or err}") from None
        try:
            return cls.loads(text)
        except StrategyError as err:
            raise StrategyError(f"strategy {path}: {err}") from None


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


__all__ = [
    "HEAD_GROUPS",
    "PHASES",
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "HeadGroup",
    "LayerChoice",
    "Strategy",
    "StrategyError",
]
