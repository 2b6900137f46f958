"""Validation and JSON encoding of signal-table fields (used by :mod:`signals.table`).

Every problem is a one-line :class:`SignalTableError` that starts with the field's name and, for a
value inside an array, its index path (``dppl[2][0][1][3]: ...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

import numpy as np

from strategies import PHASES

DIM_NAMES = ("layers", "phases", "patterns", "budgets", "samples")


class SignalTableError(ValueError):
    """A signal table file or object that breaks the schema; the message names the field."""


def is_int(x: Any) -> TypeGuard[int | np.integer]:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_num_layers(n: Any) -> int:
    if not is_int(n) or n < 1:
        raise SignalTableError(f"num_layers: must be a positive integer, got {n!r}")
    return int(n)


def check_phases(phases: Any) -> tuple[str, ...]:
    if isinstance(phases, str) or not isinstance(phases, (list, tuple)) or len(phases) == 0:
        raise SignalTableError(f"phases: must be a non-empty list drawn from {list(PHASES)}, got {phases!r}")
    for p in phases:
        if p not in PHASES:
            raise SignalTableError(f"phases: {p!r} is not one of {list(PHASES)}")
    if len(set(phases)) != len(phases):
        raise SignalTableError(f"phases: duplicates in {list(phases)}")
    return tuple(phases)


def check_patterns(patterns: Any) -> tuple[str, ...]:
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)) or len(patterns) == 0:
        raise SignalTableError(f"patterns: must be a non-empty list of names, got {patterns!r}")
    for p in patterns:
        if not isinstance(p, str) or not p:
            raise SignalTableError(f"patterns: {p!r} is not a pattern name")
    if len(set(patterns)) != len(patterns):
        raise SignalTableError(f"patterns: duplicates in {list(patterns)}")
    return tuple(patterns)


def check_budgets(budgets: Any) -> tuple[int, ...]:
    if isinstance(budgets, str) or not isinstance(budgets, (list, tuple)) or len(budgets) == 0:
        raise SignalTableError(f"budgets: must be a non-empty list of positive integers, got {budgets!r}")
    for b in budgets:
        if not is_int(b) or b < 1:
            raise SignalTableError(f"budgets: {b!r} is not a positive integer")
    if any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:])):
        raise SignalTableError(f"budgets: must be strictly increasing, got {list(budgets)}")
    return tuple(int(b) for b in budgets)


def check_full_ppl(x: Any) -> float | None:
    if x is None:
        return None
    if (
        isinstance(x, bool)
        or not isinstance(x, (int, float, np.floating, np.integer))
        or not math.isfinite(x)
        or x <= 0
    ):
        raise SignalTableError(f"full_ppl: must be a positive finite number or null, got {x!r}")
    return float(x)


def check_value(name: str, x: Any) -> float:
    """A value to store: a finite number, or NaN (= missing)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise SignalTableError(f"{name}: must be a number, got {x!r}")
    x = float(x)
    if math.isinf(x):
        raise SignalTableError(f"{name}: must be finite (NaN marks a missing value), got {x!r}")
    return x


def as_array(name: str, values: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An in-memory array of ``shape`` (all NaN when ``values`` is None); infinities are refused."""
    if values is None:
        return np.full(shape, np.nan, dtype=np.float64)
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise SignalTableError(f"{name}: not a numeric array ({err})") from None
    if arr.shape != shape:
        raise SignalTableError(f"{name}: expected shape {shape}, got {arr.shape}")
    if np.isinf(arr).any():
        idx = tuple(int(i) for i in np.argwhere(np.isinf(arr))[0])
        raise SignalTableError(f"{name}{''.join(f'[{i}]' for i in idx)}: not a finite number ({arr[idx]})")
    return arr


def encode(arr: np.ndarray) -> Any:
    """Nested lists with ``None`` for NaN (values are finite by construction)."""
    if not arr.size:
        return arr.tolist()
    out = arr.astype(object)
    out[np.isnan(arr)] = None
    return out.tolist()


def decode(name: str, data: Any, shape: tuple[int, ...], dims: tuple[str, ...] = DIM_NAMES) -> np.ndarray:
    """Nested lists of numbers or null → array; a non-finite number (``NaN``/``Infinity`` literals,
    the strings ``"inf"``/``"-inf"`` of version-1 files) is refused with its index path. ``dims`` names
    the axes in messages."""
    out = np.empty(shape, dtype=np.float64)

    def walk(node: Any, depth: int, where: str, index: tuple[int, ...]) -> None:
        if depth == len(shape):
            if node is None:
                out[index] = np.nan
            elif isinstance(node, str) and node in ("inf", "-inf", "nan"):
                raise SignalTableError(f"{where}: not a finite number ({node!r}); a missing value is null")
            elif isinstance(node, bool) or not isinstance(node, (int, float)):
                raise SignalTableError(f"{where}: expected a number or null, got {node!r}")
            elif not math.isfinite(node):
                raise SignalTableError(f"{where}: not a finite number ({node}); a missing value is null")
            else:
                out[index] = float(node)
            return
        if not isinstance(node, list):
            raise SignalTableError(
                f"{where}: expected a list of {shape[depth]} {dims[depth]}, got {type(node).__name__}"
            )
        if len(node) != shape[depth]:
            raise SignalTableError(f"{where}: expected {shape[depth]} {dims[depth]}, got {len(node)}")
        for i, child in enumerate(node):
            walk(child, depth + 1, f"{where}[{i}]", index + (i,))

    walk(data, 0, name, ())
    return out


def index_of(items: tuple, item: Any, field: str, why: str) -> int:
    """``items.index(item)``, or a one-line error ``FIELD: ITEM WHY``."""
    try:
        return items.index(item)
    except ValueError:
        raise SignalTableError(f"{field}: {item!r} {why}") from None


def check_dof(dof: Any) -> int | None:
    if dof is not None and (not is_int(dof) or dof < 1):
        raise SignalTableError(f"se_dof: must be a positive integer or null, got {dof!r}")
    return None if dof is None else int(dof)


#: What a table's cell signals average over when its provenance does not say (every table collected
#: before retrieval-aware calibration): every continuation token of prose samples.
PROSE_ONLY = "every continuation token (prose samples only)"


def retrieval_record(provenance: Mapping[str, Any], n_samples: int | None) -> dict[str, Any]:
    """The provenance's ``retrieval`` record, or the prose-only one it implies when absent."""
    record = provenance.get("retrieval")
    if isinstance(record, Mapping):
        return dict(record)
    n = provenance.get("n_samples", n_samples)
    return {"mix": "0", "evidence_samples": 0, "prose_samples": n, "scored": PROSE_ONLY}
