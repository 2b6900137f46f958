"""The signal table's JSON document: writing (version 2; 3 with per-head signals, 4 with head cells, 5 with
prefill cells of scored patterns) and reading (1-5).

One versioned, self-describing JSON file (``schema: polykv-signals``, ``version: 2``)::

    {
      "schema": "polykv-signals", "version": 2,
      "num_layers": L,
      "phases":   ["prefill", "decoding"],          # subset of PHASES, in PHASES order
      "patterns": ["snapkv", "tova", ...],          # unique names
      "budgets":  [32, 64, 128, 256],               # the grid: positive ints, strictly increasing
      "cosine":   [L][phases][patterns][budgets],   # number or null (cell not collected yet)
      "dppl":     [L][phases][patterns][budgets],   # PPL(cell) - PPL(FullKV)
      "kl":       [L][phases][patterns][budgets],   # mean per-token KL(FullKV || cell); or null: not carried
      "entropy":  [L][phases],                      # attention entropy under FullKV (normalized)
      "variance": [L][phases],                      # attention variance over queries (CAKE)
      "full_ppl": float or null,
      "uncertainty": null or {                      # see signals.uncertainty
        "se_dof": K - 1,                            # K = (sample, token block) units per cell
        "n_samples": S,
        "se": {"cosine": [L][F][P][G], "dppl": ..., "kl": ...},
        "per_sample": {"cosine": [L][F][P][G][S], "dppl": ..., "kl": ...}
      },
      "provenance": {...}                           # model id, config hash, calibration spec and
    }                                               # fingerprint, lengths, code version, timings

Every value is a finite number or ``null`` (missing; ``NaN`` in memory). Non-finite numbers are
refused with the cell named. Version 3 is version 2 plus a ``heads`` block (per layer and KV head signals,
:mod:`signals.head_signals`); a table without head signals is still written as version 2, so older
readers keep reading it. Version 4 adds the optional ``heads.cells`` (streaming cells per KV head); only a
table that carries them is written as version 4. Version 5 adds the optional ``heads.prefill_cells`` (prefill
cells of scored patterns per KV head, :mod:`signals.head_prefill_cells`); only a table that carries them is
written as version 5. Version-1 files (no ``kl``, no ``uncertainty``) load; any
other version is refused with a one-line message naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from signals.head_signals import heads_from_json
from signals.table_codec import (
    SignalTableError,
    check_budgets,
    check_num_layers,
    check_patterns,
    check_phases,
    decode,
    encode,
    is_int,
)
from strategies import PHASES

SCHEMA_NAME = "polykv-signals"
SCHEMA_VERSION = 2
#: The version of a table that carries per-head signals.
HEADS_VERSION = 3
#: The version of a table whose per-head signals carry streaming cells.
CELLS_VERSION = 4
#: The version of a table whose per-head signals carry prefill cells of scored patterns.
PREFILL_CELLS_VERSION = 5
#: Versions :func:`table_from_json` (and so :meth:`SignalTable.from_json`) reads.
READABLE_VERSIONS: tuple[int, ...] = (1, 2, 3, 4, 5)

_COMMON = ("num_layers", "phases", "patterns", "budgets", "cosine", "dppl", "entropy", "variance")
_OPTIONAL = {
    1: ("full_ppl", "provenance"),
    2: ("full_ppl", "provenance", "kl", "uncertainty"),
    3: ("full_ppl", "provenance", "kl", "uncertainty", "heads"),
    4: ("full_ppl", "provenance", "kl", "uncertainty", "heads"),
    5: ("full_ppl", "provenance", "kl", "uncertainty", "heads"),
}


def table_from_json(cls, data: Any):
    if not isinstance(data, dict):
        raise SignalTableError("signals: the top level must be a JSON object")
    if data.get("schema") != SCHEMA_NAME:
        raise SignalTableError(f"schema: expected {SCHEMA_NAME!r}, got {data.get('schema')!r}")
    version = data.get("version")
    if not is_int(version) or version not in READABLE_VERSIONS:
        raise SignalTableError(
            f"version: unsupported signal table version {version!r} (this polykv-search reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}); recollect it with `polykv-search collect`"
        )
    version = int(version)
    for key in _COMMON:
        if key not in data:
            raise SignalTableError(f"{key}: missing")
    unknown = sorted(set(data) - set(_COMMON) - set(_OPTIONAL[version]) - {"schema", "version"})
    if unknown:
        raise SignalTableError(f"signals: unknown keys {unknown} for version {version}")
    num_layers = check_num_layers(data["num_layers"])
    phases = check_phases(data["phases"])
    if list(phases) != [p for p in PHASES if p in phases]:
        raise SignalTableError(f"phases: must be in the order {list(PHASES)}, got {list(phases)}")
    patterns = check_patterns(data["patterns"])
    budgets = check_budgets(data["budgets"])
    cell = (num_layers, len(phases), len(patterns), len(budgets))
    layer = (num_layers, len(phases))
    signals = ["cosine", "dppl"] + (["kl"] if data.get("kl") is not None else [])
    arrays = {k: decode(k, data[k], cell) for k in signals}
    arrays.update({k: decode(k, data[k], layer) for k in ("entropy", "variance")})
    extra = _uncertainty(data.get("uncertainty"), signals, cell)
    return cls(
        num_layers,
        phases,
        patterns,
        budgets,
        full_ppl=data.get("full_ppl"),
        provenance=data.get("provenance", {}),
        signals=signals,
        heads=heads_from_json(data.get("heads"), num_layers, version),
        **arrays,
        **extra,
    )


def _uncertainty(block: Any, signals: list[str], cell: tuple[int, ...]) -> dict[str, Any]:
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise SignalTableError("uncertainty: must be an object or null")
    unknown = sorted(set(block) - {"se_dof", "n_samples", "se", "per_sample"})
    if unknown:
        raise SignalTableError(f"uncertainty: unknown keys {unknown}")
    dof = block.get("se_dof")
    if dof is not None and (not is_int(dof) or dof < 1):
        raise SignalTableError(f"uncertainty.se_dof: must be a positive integer or null, got {dof!r}")
    se = block.get("se") or {}
    if not isinstance(se, dict) or sorted(se) != sorted(signals):
        raise SignalTableError(f"uncertainty.se: expected an object with the keys {signals}")
    out: dict[str, Any] = {"se_dof": dof, "se": {k: decode(f"uncertainty.se.{k}", se[k], cell) for k in signals}}
    for k, arr in out["se"].items():
        if (arr < 0).any():
            raise SignalTableError(f"uncertainty.se.{k}: standard errors must be >= 0")
    per = block.get("per_sample")
    if per is not None:
        n = block.get("n_samples")
        if not is_int(n) or n < 1:
            raise SignalTableError(f"uncertainty.n_samples: must be a positive integer with per_sample, got {n!r}")
        n = int(n)
        if not isinstance(per, dict) or sorted(per) != sorted(signals):
            raise SignalTableError(f"uncertainty.per_sample: expected an object with the keys {signals}")
        out["per_sample"] = {k: decode(f"uncertainty.per_sample.{k}", per[k], (*cell, n)) for k in signals}
    return out


def table_to_json(table) -> dict[str, Any]:
    """The document of ``table`` (see :mod:`signals.table`): version 2, 3 with head signals, 4 with head cells,
    5 with prefill cells of scored patterns."""
    t = table
    uncertainty = None
    if t.se_dof is not None or t._per_sample is not None or any(np.isfinite(a).any() for a in t._se.values()):
        uncertainty = {
            "se_dof": t.se_dof,
            "n_samples": t.n_samples,
            "se": {k: encode(t._se[k]) for k in t.signals},
            "per_sample": None if t._per_sample is None else {k: encode(t._per_sample[k]) for k in t.signals},
        }
    return {
        "schema": SCHEMA_NAME,
        "version": _version(t),
        "num_layers": t.num_layers,
        "phases": list(t.phases),
        "patterns": list(t.patterns),
        "budgets": list(t.budgets),
        "cosine": encode(t._cosine),
        "dppl": encode(t._dppl),
        "kl": encode(t._kl) if "kl" in t.signals else None,
        "entropy": encode(t._entropy),
        "variance": encode(t._variance),
        "full_ppl": t.full_ppl,
        "uncertainty": uncertainty,
        "provenance": t.provenance,
        **({} if t.heads is None else {"heads": t.heads.to_json()}),
    }


def _version(table) -> int:
    """The oldest version that holds ``table``, so older readers keep reading what they can."""
    if table.heads is None:
        return SCHEMA_VERSION
    if table.heads.prefill_cells:
        return PREFILL_CELLS_VERSION
    return HEADS_VERSION if table.heads.cells is None else CELLS_VERSION
