"""The signal table: calibration signals for every (layer, phase, pattern, budget) cell.

One versioned, self-describing JSON file (``schema: polykv-signals``, ``version: 1``)::

    {
      "schema": "polykv-signals", "version": 1,
      "num_layers": L,
      "phases":   ["prefill", "decoding"],          # subset of PHASES, in PHASES order
      "patterns": ["snapkv", "tova", ...],          # unique names
      "budgets":  [32, 64, 128, 256],               # the grid: positive ints, strictly increasing
      "cosine":   [L][phases][patterns][budgets],   # number or null (cell not collected yet)
      "dppl":     [L][phases][patterns][budgets],   # PPL(cell) - PPL(FullKV); number or null
      "entropy":  [L][phases],                      # attention entropy under FullKV (normalized)
      "variance": [L][phases],                      # attention variance over queries (CAKE)
      "full_ppl": float or null,
      "provenance": {...}                           # model id, config hash, calibration spec and
    }                                               # fingerprint, sample counts/lengths, code
                                                    # version, timings (free-form object)

Missing values are ``NaN`` in memory and ``null`` on disk; ``+inf``/``-inf`` (a ΔPPL that overflowed)
are written as the strings ``"inf"``/``"-inf"``.

>>> t = SignalTable.empty(2, ["prefill"], ["snapkv", "tova"], [64, 32], {"model": "tiny"})
>>> t.budgets
(32, 64)
>>> t.set_cell(0, "prefill", "snapkv", 32, cosine=0.9, dppl=0.5)
>>> float(t.cosine_array()[0, 0, 0, 0])
0.9
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from polykv_search.io import atomic_write_text

SCHEMA_NAME = "polykv-signals"
SCHEMA_VERSION = 1
PHASES: tuple[str, ...] = ("prefill", "decoding")
CELL_SIGNALS: tuple[str, ...] = ("cosine", "dppl")
LAYER_SIGNALS: tuple[str, ...] = ("entropy", "variance")


class SignalTableError(ValueError):
    """A signal table file or object that breaks the schema; the message names the field."""


class SignalTable:
    """Per-cell cosine and ΔPPL, per-(layer, phase) entropy and variance, FullKV PPL, provenance.

    Build an empty table with :meth:`empty` and fill it with :meth:`set_cell` / :meth:`set_layer`
    (what the collector does), or read one with :meth:`load`. Array accessors return copies with
    axes ``(layer, phase, pattern, budget)`` in the order of :attr:`phases`, :attr:`patterns` and
    :attr:`budgets`.
    """

    def __init__(
        self,
        num_layers: int,
        phases: Sequence[str],
        patterns: Sequence[str],
        budgets: Sequence[int],
        *,
        cosine: Any = None,
        dppl: Any = None,
        entropy: Any = None,
        variance: Any = None,
        full_ppl: float | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        self.num_layers = _check_num_layers(num_layers)
        self.phases = _check_phases(phases)
        self.patterns = _check_patterns(patterns)
        self.budgets = _check_budgets(budgets)
        cell_shape = (self.num_layers, len(self.phases), len(self.patterns), len(self.budgets))
        layer_shape = (self.num_layers, len(self.phases))
        self._cosine = _array("cosine", cosine, cell_shape)
        self._dppl = _array("dppl", dppl, cell_shape)
        self._entropy = _array("entropy", entropy, layer_shape)
        self._variance = _array("variance", variance, layer_shape)
        self.full_ppl = _check_full_ppl(full_ppl)
        if provenance is not None and not isinstance(provenance, Mapping):
            raise SignalTableError("provenance: must be an object")
        self.provenance: dict[str, Any] = dict(provenance or {})

    # ------------------------------------------------------------ construction
    @classmethod
    def empty(
        cls,
        num_layers: int,
        phases: Iterable[str],
        patterns: Iterable[str],
        budgets: Iterable[int],
        provenance: Mapping[str, Any] | None = None,
    ) -> "SignalTable":
        """A table with every value missing (NaN). ``phases`` are put in PHASES order and
        ``budgets`` sorted; ``patterns`` keep the given order."""
        phases = list(phases)
        ordered = [p for p in PHASES if p in phases]
        if len(ordered) != len(phases):
            _check_phases(phases)  # raises with the offending name
        budgets = list(budgets)
        if all(_is_int(b) for b in budgets):
            budgets = sorted(budgets)
        return cls(num_layers, ordered, list(patterns), budgets, provenance=provenance)

    # ---------------------------------------------------------------- indexing
    def phase_index(self, phase: str) -> int:
        try:
            return self.phases.index(phase)
        except ValueError:
            raise SignalTableError(f"phase: {phase!r} is not in this table (phases: {list(self.phases)})") from None

    def pattern_index(self, pattern: str) -> int:
        try:
            return self.patterns.index(pattern)
        except ValueError:
            raise SignalTableError(
                f"pattern: {pattern!r} is not in this table (patterns: {list(self.patterns)})"
            ) from None

    def budget_index(self, budget: int) -> int:
        try:
            return self.budgets.index(budget)
        except ValueError:
            raise SignalTableError(f"budget: {budget!r} is not in this table's grid {list(self.budgets)}") from None

    def _layer(self, layer: int) -> int:
        if not _is_int(layer) or not 0 <= layer < self.num_layers:
            raise SignalTableError(f"layer: {layer!r} is out of range [0, {self.num_layers})")
        return layer

    # ----------------------------------------------------------------- filling
    def set_cell(
        self,
        layer: int,
        phase: str,
        pattern: str,
        budget: int,
        *,
        cosine: float | None = None,
        dppl: float | None = None,
    ) -> None:
        """Record one cell's signals (arguments left as ``None`` are not touched)."""
        idx = (self._layer(layer), self.phase_index(phase), self.pattern_index(pattern), self.budget_index(budget))
        if cosine is not None:
            self._cosine[idx] = _value("cosine", cosine)
        if dppl is not None:
            self._dppl[idx] = _value("dppl", dppl)

    def set_layer(
        self, layer: int, phase: str, *, entropy: float | None = None, variance: float | None = None
    ) -> None:
        """Record one (layer, phase)'s FullKV attention statistics."""
        idx = (self._layer(layer), self.phase_index(phase))
        if entropy is not None:
            self._entropy[idx] = _value("entropy", entropy)
        if variance is not None:
            self._variance[idx] = _value("variance", variance)

    def set_full_ppl(self, ppl: float) -> None:
        self.full_ppl = _check_full_ppl(ppl)

    # ---------------------------------------------------------------- reading
    def cosine_array(self) -> np.ndarray:
        """Cosine similarity, shape ``(L, n_phases, n_patterns, n_budgets)``; NaN = missing."""
        return self._cosine.copy()

    def dppl_array(self) -> np.ndarray:
        """ΔPPL, shape ``(L, n_phases, n_patterns, n_budgets)``; NaN = missing."""
        return self._dppl.copy()

    def entropy_array(self) -> np.ndarray:
        """Normalized attention entropy under FullKV, shape ``(L, n_phases)``."""
        return self._entropy.copy()

    def variance_array(self) -> np.ndarray:
        """Attention variance over queries under FullKV, shape ``(L, n_phases)``."""
        return self._variance.copy()

    def cell(self, layer: int, phase: str, pattern: str, budget: int) -> tuple[float, float]:
        """``(cosine, dppl)`` of one cell (NaN where missing)."""
        idx = (self._layer(layer), self.phase_index(phase), self.pattern_index(pattern), self.budget_index(budget))
        return float(self._cosine[idx]), float(self._dppl[idx])

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self._cosine.shape  # type: ignore[return-value]

    def missing_cells(self) -> list[tuple[int, str, str, int]]:
        """Cells whose cosine or ΔPPL is missing, as ``(layer, phase, pattern, budget)``."""
        miss = np.isnan(self._cosine) | np.isnan(self._dppl)
        return [
            (int(l), self.phases[f], self.patterns[p], self.budgets[b]) for l, f, p, b in zip(*np.nonzero(miss))
        ]

    def is_complete(self) -> bool:
        """True when every cell and every (layer, phase) statistic is present, and full_ppl is set."""
        return not (
            np.isnan(self._cosine).any()
            or np.isnan(self._dppl).any()
            or np.isnan(self._entropy).any()
            or np.isnan(self._variance).any()
            or self.full_ppl is None
        )

    # ------------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_NAME,
            "version": SCHEMA_VERSION,
            "num_layers": self.num_layers,
            "phases": list(self.phases),
            "patterns": list(self.patterns),
            "budgets": list(self.budgets),
            "cosine": _encode(self._cosine),
            "dppl": _encode(self._dppl),
            "entropy": _encode(self._entropy),
            "variance": _encode(self._variance),
            "full_ppl": self.full_ppl,
            "provenance": self.provenance,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), allow_nan=False) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write atomically (readers see the old file or the new one, never half)."""
        try:
            text = self.dumps()
        except (TypeError, ValueError) as err:
            raise SignalTableError(f"provenance: not JSON-serializable ({err})") from None
        return atomic_write_text(path, text)

    def digest(self) -> str:
        """A short content hash of the grid and every value (provenance excluded)."""
        body = self.to_json()
        body.pop("provenance")
        return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: Any) -> "SignalTable":
        if not isinstance(data, dict):
            raise SignalTableError("signals: the top level must be a JSON object")
        if data.get("schema") != SCHEMA_NAME:
            raise SignalTableError(f"schema: expected {SCHEMA_NAME!r}, got {data.get('schema')!r}")
        if data.get("version") != SCHEMA_VERSION:
            raise SignalTableError(
                f"version: unsupported schema version {data.get('version')!r} (expected {SCHEMA_VERSION})"
            )
        required = ("num_layers", "phases", "patterns", "budgets", *CELL_SIGNALS, *LAYER_SIGNALS)
        for key in required:
            if key not in data:
                raise SignalTableError(f"{key}: missing")
        known = set(required) | {"schema", "version", "full_ppl", "provenance"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SignalTableError(f"signals: unknown keys {unknown}")
        num_layers = _check_num_layers(data["num_layers"])
        phases = _check_phases(data["phases"])
        if list(phases) != [p for p in PHASES if p in phases]:
            raise SignalTableError(f"phases: must be in the order {list(PHASES)}, got {list(phases)}")
        patterns = _check_patterns(data["patterns"])
        budgets = _check_budgets(data["budgets"])
        cell_shape = (num_layers, len(phases), len(patterns), len(budgets))
        layer_shape = (num_layers, len(phases))
        arrays = {k: _decode(k, data[k], cell_shape) for k in CELL_SIGNALS}
        arrays.update({k: _decode(k, data[k], layer_shape) for k in LAYER_SIGNALS})
        return cls(
            num_layers,
            phases,
            patterns,
            budgets,
            full_ppl=data.get("full_ppl"),
            provenance=data.get("provenance", {}),
            **arrays,
        )

    @classmethod
    def loads(cls, text: str) -> "SignalTable":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SignalTableError(f"signals: not valid JSON ({err})") from None
        return cls.from_json(data)

    @classmethod
    def load(cls, path: str | Path) -> "SignalTable":
        """Read and validate a signal table file; every problem is a one-line :class:`SignalTableError`."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise SignalTableError(f"signals: cannot read {path}: {err.strerror}") from None
        except UnicodeDecodeError:
            raise SignalTableError(f"signals: {path} is not a UTF-8 text file") from None
        return cls.loads(text)

    # --------------------------------------------------------------- equality
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SignalTable):
            return NotImplemented
        return (
            self.num_layers == other.num_layers
            and self.phases == other.phases
            and self.patterns == other.patterns
            and self.budgets == other.budgets
            and all(
                np.array_equal(getattr(self, f"_{k}"), getattr(other, f"_{k}"), equal_nan=True)
                for k in (*CELL_SIGNALS, *LAYER_SIGNALS)
            )
            and self.full_ppl == other.full_ppl
            and self.provenance == other.provenance
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        done = int((~(np.isnan(self._cosine) | np.isnan(self._dppl))).sum())
        return (
            f"SignalTable(num_layers={self.num_layers}, phases={list(self.phases)}, patterns={list(self.patterns)}, "
            f"budgets={list(self.budgets)}, cells={done}/{self._cosine.size})"
        )


# ---------------------------------------------------------------------- synthetic
def random_signal_table(
    num_layers: int = 8,
    phases: Sequence[str] = PHASES,
    patterns: Sequence[str] = ("snapkv", "tova", "h2o", "streaming_llm"),
    budgets: Sequence[int] = (32, 64, 128, 256),
    *,
    seed: int = 0,
    missing: float = 0.0,
    provenance: Mapping[str, Any] | None = None,
) -> SignalTable:
    """A plausible random table for tests and benchmarks (not calibration data).

    Per layer a random sensitivity, per (layer, pattern) a random affinity; ΔPPL decreases and
    cosine increases with the budget, with noise. ``missing`` is the fraction of cells left NaN.
    """
    rng = np.random.default_rng(seed)
    table = SignalTable.empty(
        num_layers, phases, patterns, budgets, provenance or {"model": "synthetic", "seed": seed}
    )
    L, F, P, G = table.shape
    grid = np.asarray(table.budgets, dtype=float)
    decay = (grid.min() / grid) ** 0.7  # 1 at the smallest budget, decreasing
    sens = rng.gamma(2.0, 1.0, size=(L, F, 1, 1))
    affinity = rng.uniform(0.3, 1.5, size=(L, F, P, 1))
    noise = rng.normal(0.0, 0.05, size=(L, F, P, G))
    dppl = sens * affinity * decay[None, None, None, :] * (1.0 + noise)
    cosine = 1.0 - 0.3 * np.tanh(dppl / 2.0) + rng.normal(0.0, 0.01, size=dppl.shape)
    cosine = np.clip(cosine, -1.0, 1.0)
    if missing > 0:
        mask = rng.random(dppl.shape) < missing
        dppl[mask] = np.nan
        cosine[mask] = np.nan
    table._dppl[...] = dppl
    table._cosine[...] = cosine
    table._entropy[...] = rng.uniform(0.2, 0.95, size=(L, F))
    table._variance[...] = rng.uniform(1e-4, 1e-2, size=(L, F))
    table.full_ppl = float(rng.uniform(10.0, 30.0))
    return table


# ----------------------------------------------------------------------- helpers
def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_num_layers(n: Any) -> int:
    if not _is_int(n) or n < 1:
        raise SignalTableError(f"num_layers: must be a positive integer, got {n!r}")
    return int(n)


def _check_phases(phases: Any) -> tuple[str, ...]:
    if isinstance(phases, str) or not isinstance(phases, (list, tuple)) or len(phases) == 0:
        raise SignalTableError(f"phases: must be a non-empty list drawn from {list(PHASES)}, got {phases!r}")
    for p in phases:
        if p not in PHASES:
            raise SignalTableError(f"phases: {p!r} is not one of {list(PHASES)}")
    if len(set(phases)) != len(phases):
        raise SignalTableError(f"phases: duplicates in {list(phases)}")
    return tuple(phases)


def _check_patterns(patterns: Any) -> tuple[str, ...]:
    if isinstance(patterns, str) or not isinstance(patterns, (list, tuple)) or len(patterns) == 0:
        raise SignalTableError(f"patterns: must be a non-empty list of names, got {patterns!r}")
    for p in patterns:
        if not isinstance(p, str) or not p:
            raise SignalTableError(f"patterns: {p!r} is not a pattern name")
    if len(set(patterns)) != len(patterns):
        raise SignalTableError(f"patterns: duplicates in {list(patterns)}")
    return tuple(patterns)


def _check_budgets(budgets: Any) -> tuple[int, ...]:
    if isinstance(budgets, str) or not isinstance(budgets, (list, tuple)) or len(budgets) == 0:
        raise SignalTableError(f"budgets: must be a non-empty list of positive integers, got {budgets!r}")
    for b in budgets:
        if not _is_int(b) or b < 1:
            raise SignalTableError(f"budgets: {b!r} is not a positive integer")
    if any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:])):
        raise SignalTableError(f"budgets: must be strictly increasing, got {list(budgets)}")
    return tuple(int(b) for b in budgets)


def _check_full_ppl(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)) or not math.isfinite(x) or x <= 0:
        raise SignalTableError(f"full_ppl: must be a positive finite number or null, got {x!r}")
    return float(x)


def _value(name: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.floating, np.integer)):
        raise SignalTableError(f"{name}: must be a number, got {x!r}")
    return float(x)


def _array(name: str, values: Any, shape: tuple[int, ...]) -> np.ndarray:
    if values is None:
        return np.full(shape, np.nan, dtype=np.float64)
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise SignalTableError(f"{name}: not a numeric array ({err})") from None
    if arr.shape != shape:
        raise SignalTableError(f"{name}: expected shape {shape}, got {arr.shape}")
    return arr


def _encode(arr: np.ndarray) -> Any:
    def enc(x: float) -> Any:
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x

    return np.vectorize(enc, otypes=[object])(arr).tolist() if arr.size else arr.tolist()


_DIM_NAMES = ("layers", "phases", "patterns", "budgets")


def _decode(name: str, data: Any, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype=np.float64)

    def walk(node: Any, depth: int, where: str, index: tuple[int, ...]) -> None:
        if depth == len(shape):
            if node is None:
                out[index] = np.nan
            elif node == "inf" or node == "-inf":
                out[index] = math.inf if node == "inf" else -math.inf
            elif isinstance(node, bool) or not isinstance(node, (int, float)):
                raise SignalTableError(f"{where}: expected a number or null, got {node!r}")
            else:
                out[index] = float(node)
            return
        if not isinstance(node, list):
            raise SignalTableError(f"{where}: expected a list of {shape[depth]} {_DIM_NAMES[depth]}, got {type(node).__name__}")
        if len(node) != shape[depth]:
            raise SignalTableError(f"{where}: expected {shape[depth]} {_DIM_NAMES[depth]}, got {len(node)}")
        for i, child in enumerate(node):
            walk(child, depth + 1, f"{where}[{i}]", index + (i,))

    walk(data, 0, name, ())
    return out


__all__ = [
    "CELL_SIGNALS",
    "LAYER_SIGNALS",
    "PHASES",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "SignalTable",
    "SignalTableError",
    "random_signal_table",
]
