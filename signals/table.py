"""The signal table: calibration signals for every (layer, phase, pattern, budget) cell.

One versioned, self-describing JSON file (``schema: polykv-signals``, ``version: 2``; the format is
specified in :mod:`signals.table_json`): per cell cosine, ΔPPL and KL with standard errors and
per-sample values, per (layer, phase) entropy and variance, the FullKV PPL and provenance. Every
value is a finite number or missing (``null`` on disk, ``NaN`` in memory). Version-1 files load;
other versions are refused with one line naming the version.

>>> t = SignalTable.empty(2, ["prefill"], ["snapkv", "tova"], [64, 32], {"model": "tiny"})
>>> t.budgets
(32, 64)
>>> t.set_cell(0, "prefill", "snapkv", 32, cosine=0.9, dppl=0.5, kl=0.1)
>>> float(t.cosine_array()[0, 0, 0, 0])
0.9
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from signals.head_signals import HeadSignals
from signals.table_codec import (
    SignalTableError,
    as_array,
    check_budgets,
    check_dof,
    check_full_ppl,
    check_num_layers,
    check_patterns,
    check_phases,
    check_value,
    index_of,
    is_int,
    retrieval_record,
)
from signals.table_io import TableFileMixin
from signals.table_json import READABLE_VERSIONS, SCHEMA_NAME, SCHEMA_VERSION
from signals.uncertainty import t_quantile
from strategies import PHASES

CELL_SIGNALS: tuple[str, ...] = ("cosine", "dppl", "kl")
LAYER_SIGNALS: tuple[str, ...] = ("entropy", "variance")
#: Signals where 0 means "as FullKV" (cosine's FullKV value is 1).
_FULL_VALUE = {"cosine": 1.0, "dppl": 0.0, "kl": 0.0}


class SignalTable(TableFileMixin):
    """Per-cell cosine, ΔPPL and KL (with standard errors and per-sample values), per-(layer,
    phase) entropy and variance, FullKV PPL, provenance.

    Build an empty table with :meth:`empty` and fill it with :meth:`set_cell` / :meth:`set_layer`
    (what the collector does), or read one with :meth:`load`. Array accessors return copies with
    axes ``(layer, phase, pattern, budget)`` in the order of :attr:`phases`, :attr:`patterns` and
    :attr:`budgets`. :attr:`signals` lists the cell signals the table carries (a version-1 table
    has no ``kl``).
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
        kl: Any = None,
        entropy: Any = None,
        variance: Any = None,
        full_ppl: float | None = None,
        provenance: Mapping[str, Any] | None = None,
        signals: Sequence[str] = CELL_SIGNALS,
        se: Mapping[str, Any] | None = None,
        per_sample: Mapping[str, Any] | None = None,
        se_dof: int | None = None,
        heads: HeadSignals | None = None,
    ) -> None:
        self.num_layers = check_num_layers(num_layers)
        self.phases = check_phases(phases)
        self.patterns = check_patterns(patterns)
        self.budgets = check_budgets(budgets)
        unknown = [s for s in signals if s not in CELL_SIGNALS]
        if unknown or not {"cosine", "dppl"} <= set(signals):
            raise SignalTableError(
                f"signals: must include cosine and dppl, drawn from {list(CELL_SIGNALS)}, got {list(signals)}"
            )
        self.signals = tuple(s for s in CELL_SIGNALS if s in signals)
        shape = self.cell_shape
        self._cosine = as_array("cosine", cosine, shape)
        self._dppl = as_array("dppl", dppl, shape)
        self._kl = as_array("kl", kl, shape)
        layer_shape = (self.num_layers, len(self.phases))
        self._entropy = as_array("entropy", entropy, layer_shape)
        self._variance = as_array("variance", variance, layer_shape)
        self._se = {k: as_array(f"se.{k}", (se or {}).get(k), shape) for k in self.signals}
        self._per_sample: dict[str, np.ndarray] | None = None
        if per_sample is not None:
            arrays = {k: np.asarray(v, dtype=np.float64) for k, v in per_sample.items()}
            n = next(iter(arrays.values())).shape[-1] if arrays else 0
            self._per_sample = {k: as_array(f"per_sample.{k}", arrays.get(k), (*shape, n)) for k in self.signals}
        self.se_dof = check_dof(se_dof)
        self.full_ppl = check_full_ppl(full_ppl)
        if provenance is not None and not isinstance(provenance, Mapping):
            raise SignalTableError("provenance: must be an object")
        self.provenance: dict[str, Any] = dict(provenance or {})
        self.heads: HeadSignals | None = None
        if heads is not None:
            self.set_heads(heads)

    # ------------------------------------------------------------ construction
    @classmethod
    def empty(
        cls,
        num_layers: int,
        phases: Iterable[str],
        patterns: Iterable[str],
        budgets: Iterable[int],
        provenance: Mapping[str, Any] | None = None,
    ) -> SignalTable:
        """A table with every value missing (NaN). ``phases`` are put in PHASES order and
        ``budgets`` sorted; ``patterns`` keep the given order."""
        phases = list(phases)
        ordered = [p for p in PHASES if p in phases]
        if len(ordered) != len(phases):
            check_phases(phases)  # raises with the offending name
        budgets = list(budgets)
        if all(is_int(b) for b in budgets):
            budgets = sorted(budgets)
        return cls(num_layers, ordered, list(patterns), budgets, provenance=provenance)

    @property
    def cell_shape(self) -> tuple[int, int, int, int]:
        return (self.num_layers, len(self.phases), len(self.patterns), len(self.budgets))

    shape = cell_shape

    # ---------------------------------------------------------------- indexing
    def phase_index(self, phase: str) -> int:
        return index_of(self.phases, phase, "phase", f"is not in this table (phases: {list(self.phases)})")

    def pattern_index(self, pattern: str) -> int:
        return index_of(self.patterns, pattern, "pattern", f"is not in this table (patterns: {list(self.patterns)})")

    def budget_index(self, budget: int) -> int:
        return index_of(self.budgets, budget, "budget", f"is not in this table's grid {list(self.budgets)}")

    def _layer(self, layer: int) -> int:
        if not is_int(layer) or not 0 <= layer < self.num_layers:
            raise SignalTableError(f"layer: {layer!r} is out of range [0, {self.num_layers})")
        return layer

    def _cell_index(self, layer: int, phase: str, pattern: str, budget: int) -> tuple[int, int, int, int]:
        return (self._layer(layer), self.phase_index(phase), self.pattern_index(pattern), self.budget_index(budget))

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
        kl: float | None = None,
        se: Mapping[str, float] | None = None,
        per_sample: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        """Record one cell's signals (arguments left as ``None`` are not touched); NaN marks a
        value as missing. ``se`` and ``per_sample`` are keyed by signal name."""
        idx = self._cell_index(layer, phase, pattern, budget)
        for name, value in (("cosine", cosine), ("dppl", dppl), ("kl", kl)):
            if value is not None:
                self._require_signal(name)
                getattr(self, f"_{name}")[idx] = check_value(name, value)
        for name, value in (se or {}).items():
            self._require_signal(name)
            self._se[name][idx] = check_value(f"se.{name}", value)
            if value < 0:
                raise SignalTableError(f"se.{name}: must be >= 0, got {value!r}")
        if per_sample:
            lengths = {len(v) for v in per_sample.values()}
            if len(lengths) != 1:
                raise SignalTableError("per_sample: every signal needs the same number of samples")
            n = lengths.pop()
            if self._per_sample is None:
                self._per_sample = {k: np.full((*self.cell_shape, n), np.nan) for k in self.signals}
            if self.n_samples != n:
                raise SignalTableError(f"per_sample: {n} values, but this table holds {self.n_samples} per cell")
            for name, values in per_sample.items():
                self._require_signal(name)
                self._per_sample[name][idx] = [check_value(f"per_sample.{name}", v) for v in values]

    def _require_signal(self, name: str) -> None:
        if name not in self.signals:
            raise SignalTableError(
                f"{name}: this table does not carry the {name!r} signal (signals: {list(self.signals)})"
            )

    def set_layer(self, layer: int, phase: str, *, entropy: float | None = None, variance: float | None = None) -> None:
        """Record one (layer, phase)'s FullKV attention statistics."""
        idx = (self._layer(layer), self.phase_index(phase))
        if entropy is not None:
            self._entropy[idx] = check_value("entropy", entropy)
        if variance is not None:
            self._variance[idx] = check_value("variance", variance)

    def set_full_ppl(self, ppl: float) -> None:
        self.full_ppl = check_full_ppl(ppl)

    def set_heads(self, heads: HeadSignals | None) -> None:
        """Attach per-(layer, KV head) signals (None removes them)."""
        if heads is not None and heads.retrieval.mean.shape[0] != self.num_layers:
            raise SignalTableError(
                f"heads: {heads.retrieval.mean.shape[0]} layers of head signals for a {self.num_layers}-layer table"
            )
        self.heads = heads

    def set_se_dof(self, dof: int | None) -> None:
        """Degrees of freedom of the standard errors (units − 1), or None."""
        self.se_dof = check_dof(dof)

    # ---------------------------------------------------------------- reading
    def signal_array(self, name: str) -> np.ndarray:
        """One cell signal (``cosine``, ``dppl``, ``kl``), shape ``(L, F, P, G)``; NaN = missing."""
        if name not in CELL_SIGNALS:
            raise SignalTableError(f"signal: {name!r} is not one of {list(CELL_SIGNALS)}")
        return getattr(self, f"_{name}").copy()

    def cosine_array(self) -> np.ndarray:
        """Cosine similarity ``(L, F, P, G)``; NaN = missing."""
        return self._cosine.copy()

    def dppl_array(self) -> np.ndarray:
        """ΔPPL ``(L, F, P, G)``; NaN = missing."""
        return self._dppl.copy()

    def kl_array(self) -> np.ndarray:
        """Mean per-token KL(FullKV ‖ cell) ``(L, F, P, G)``; all NaN without the KL signal."""
        return self._kl.copy()

    def entropy_array(self) -> np.ndarray:
        """Normalized FullKV attention entropy ``(L, F)``."""
        return self._entropy.copy()

    def variance_array(self) -> np.ndarray:
        """FullKV attention variance over queries ``(L, F)``."""
        return self._variance.copy()

    def se_array(self, name: str) -> np.ndarray:
        """Standard error of a cell signal (NaN where unknown; all NaN in a version-1 table)."""
        if name not in self.signals:
            return np.full(self.cell_shape, np.nan)
        return self._se[name].copy()

    def per_sample_array(self, name: str) -> np.ndarray | None:
        """Per-sample values ``(L, F, P, G, S)`` of a cell signal, or None when not recorded."""
        if self._per_sample is None or name not in self._per_sample:
            return None
        return self._per_sample[name].copy()

    @property
    def n_samples(self) -> int | None:
        """Samples per cell in :meth:`per_sample_array` (None when the table has none)."""
        if self._per_sample is None:
            return None
        return int(next(iter(self._per_sample.values())).shape[-1])

    @property
    def retrieval(self) -> dict[str, Any]:
        """The calibration's retrieval mix (provenance ``retrieval``: evidence samples, what was
        scored); a table collected before retrieval-aware calibration reads as prose-only."""
        return retrieval_record(self.provenance, self.n_samples)

    @property
    def has_uncertainty(self) -> bool:
        """True when standard errors (with their degrees of freedom) are recorded."""
        return self.se_dof is not None and any(np.isfinite(a).any() for a in self._se.values())

    def interval(self, name: str, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` of each cell's ``level`` interval: value ± t·SE (t with ``se_dof``
        degrees of freedom); NaN where the value or its SE is unknown."""
        value = self.signal_array(name)
        half = t_quantile(level, self.se_dof) * self.se_array(name)
        return value - half, value + half

    def indistinguishable(self, name: str = "dppl", level: float = 0.95) -> np.ndarray:
        """Cells whose ``level`` interval of signal ``name`` contains its FullKV value (0 for ΔPPL
        and KL, 1 for cosine): the calibration cannot tell them from FullKV. False where unknown."""
        lo, hi = self.interval(name, level)
        full = _FULL_VALUE[name]
        with np.errstate(invalid="ignore"):
            return (lo <= full) & (hi >= full)

    def cell(self, layer: int, phase: str, pattern: str, budget: int) -> tuple[float, float]:
        """``(cosine, dppl)`` of one cell (NaN where missing)."""
        idx = self._cell_index(layer, phase, pattern, budget)
        return float(self._cosine[idx]), float(self._dppl[idx])

    def missing_cells(self) -> list[tuple[int, str, str, int]]:
        """Cells with a missing value of any carried signal, as ``(layer, phase, pattern, budget)``."""
        miss = np.zeros(self.cell_shape, dtype=bool)
        for name in self.signals:
            miss |= np.isnan(getattr(self, f"_{name}"))
        return [(int(l), self.phases[f], self.patterns[p], self.budgets[b]) for l, f, p, b in zip(*np.nonzero(miss))]

    def is_complete(self) -> bool:
        """True when every carried cell signal and every (layer, phase) statistic is present, and
        full_ppl is set."""
        return not (
            self.missing_cells()
            or np.isnan(self._entropy).any()
            or np.isnan(self._variance).any()
            or self.full_ppl is None
        )

    # --------------------------------------------------------------- equality
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SignalTable):
            return NotImplemented
        same = lambda a, b: np.array_equal(a, b, equal_nan=True)  # noqa: E731
        return (
            (self.num_layers, self.phases, self.patterns, self.budgets, self.signals)
            == (other.num_layers, other.phases, other.patterns, other.budgets, other.signals)
            and all(same(getattr(self, f"_{k}"), getattr(other, f"_{k}")) for k in (*CELL_SIGNALS, *LAYER_SIGNALS))
            and all(same(self._se[k], other._se[k]) for k in self.signals)
            and (self.n_samples == other.n_samples)
            and (
                self._per_sample is None
                or other._per_sample is not None
                and all(same(self._per_sample[k], other._per_sample[k]) for k in self.signals)
            )
            and self.se_dof == other.se_dof
            and self.full_ppl == other.full_ppl
            and self.provenance == other.provenance
            and self.heads == other.heads
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        total = int(np.prod(self.cell_shape))
        return (
            f"SignalTable(num_layers={self.num_layers}, phases={list(self.phases)}, patterns={list(self.patterns)}, "
            f"budgets={list(self.budgets)}, cells={total - len(self.missing_cells())}/{total})"
        )


__all__ = [
    "CELL_SIGNALS",
    "LAYER_SIGNALS",
    "PHASES",
    "READABLE_VERSIONS",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "SignalTable",
    "SignalTableError",
]
