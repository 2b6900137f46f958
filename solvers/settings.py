"""Solver settings: frozen dataclasses whose fields describe themselves for a CLI, and the error type."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The largest seed: numpy's legacy seeding (optuna's samplers) takes 0 .. 2**32 - 1, torch.manual_seed less than
#: 2**64; every seed here is in 0 .. MAX_SEED.
MAX_SEED = 2**32 - 1


class SolverError(ValueError):
    """Bad or infeasible solver input; the message is one line and names the problem."""


def setting(default: Any, help: str, choices: Sequence[Any] | None = None, *, most: int | None = None) -> Any:
    """A settings field with CLI metadata: ``help`` text, optional ``choices``, and for a count the ``most`` it takes
    (a count with no sane bound would run for days or fill the memory before anything is written)."""
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if most is not None:
        meta["most"] = most
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SettingInfo:
    """One setting as a CLI sees it: ``--{name.replace('_', '-')}``."""

    name: str
    type: str  # "str", "int", "float", "bool", with "|None" when it may be omitted
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    most: int | None = None  #: the largest value a count takes

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Settings:
    """Base of every solver's settings. Subclasses add fields with :func:`setting` and extra checks
    in :meth:`check`. Types and choices are checked here; ints are accepted for float fields."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind, optional = _kind(hints[f.name])
            if value is None:
                if not optional:
                    raise SolverError(f"{f.name}: must be given (a {kind})")
                continue
            if kind == "float" and is_int(value):
                value = float(value)
                object.__setattr__(self, f.name, value)
            if not _has_kind(value, kind):
                raise SolverError(f"{f.name}: must be a {kind}, got {value!r}")
            if kind == "float" and not math.isfinite(value):
                raise SolverError(f"{f.name}: must be finite, got {value!r}")
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise SolverError(f"{f.name}: {value!r} is not one of {list(choices)}")
            most = f.metadata.get("most")
            if most is not None and value > most:
                raise SolverError(f"{f.name}: expected at most {most:,}, got {value:,}")
        self.check()

    def check(self) -> None:
        """Extra validation (ranges, cross-field rules); raise :class:`SolverError`."""

    def check_seeds(self, *names: str) -> None:
        """Refuse a negative seed among ``names`` (their fields cap them at :data:`MAX_SEED`; None: unset)."""
        for name in names:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SolverError(f"{name}: a seed must be >= 0, got {value}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def fields_info(cls) -> list[SettingInfo]:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            kind, optional = _kind(hints[f.name])
            out.append(
                SettingInfo(
                    f.name,
                    kind + ("|None" if optional else ""),
                    f.default,
                    f.metadata.get("help", ""),
                    f.metadata.get("choices"),
                    f.metadata.get("most"),
                )
            )
        return out

    @classmethod
    def from_strings(cls, values: Mapping[str, str | None]) -> Settings:
        """Build from CLI strings (``{"beta": "20", "window": "none"}``); unknown names are errors."""
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in values.items():
            name = key.lstrip("-").replace("-", "_")
            if name not in names:
                raise SolverError(f"{key}: unknown setting; known: {sorted(names)}")
            kind, optional = _kind(hints[name])
            kwargs[name] = _parse(name, raw, kind, optional)
        return cls(**kwargs)


def _kind(tp: Any) -> tuple[str, bool]:
    args = typing.get_args(tp)
    optional = type(None) in args
    base = [a for a in args if a is not type(None)] if args else [tp]
    t = base[0] if len(base) == 1 else tp
    names = {str: "str", int: "int", float: "float", bool: "bool"}
    if t not in names:
        raise TypeError(f"settings fields must be str/int/float/bool (optionally | None), got {tp!r}")
    return names[t], optional


def _has_kind(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return is_int(value)
    if kind == "float":
        return isinstance(value, float)
    return isinstance(value, str)


def _parse(name: str, raw: Any, kind: str, optional: bool) -> Any:
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if optional and text.lower() in ("", "none", "null"):
        return None
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
    except ValueError:
        raise SolverError(f"{name}: {raw!r} is not a valid {kind}") from None
    return text


def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)
