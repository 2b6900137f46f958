"""Calibration signals: collectors (cosine, entropy/variance, ΔPPL), the collection driver, and the
signal table file (:mod:`signals.table`).

>>> from signals import SignalTable
>>> table = SignalTable.empty(30, ["prefill", "decoding"], ["snapkv", "tova"], [32, 64], {"model": "m"})

Collection (``polykv-search collect``; imported lazily, since it needs torch)::

    from signals import collect_signals, ModelLoader
    table = collect_signals(model, samples, budgets=[32, 64, 128, 256], out="signals.json")

Modules: :mod:`signals.cosine`, :mod:`signals.ppl` (ΔPPL and KL), :mod:`signals.entropy` (one
collector per signal), :mod:`signals.uncertainty` (standard errors over samples and token blocks),
:mod:`signals.predict` (a strategy's predicted degradation), :mod:`signals.fullkv` (the FullKV pass),
:mod:`signals.replay` (fast cell evaluation), :mod:`signals.naive` (one forward per cell, the reference),
:mod:`signals.journal` (resume),
:mod:`signals.collect` (the driver).
"""

import importlib

from signals.synthetic import random_signal_table
from signals.table import (
    CELL_SIGNALS,
    PHASES,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    SignalTable,
    SignalTableError,
)

_LAZY = {
    "collect_signals": "signals.collect",
    "CollectError": "signals.collect",
    "CollectSettings": "signals.collect",
    "ModelLoader": "signals.collect",
    "DEFAULT_PATTERNS": "signals.collect",
    "DEFAULT_BUDGETS": "signals.collect",
    "journal_path": "signals.journal",
}


def __getattr__(name):
    if name in _LAZY:  # collection needs torch: loaded on first use
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'signals' has no attribute {name!r}")


__all__ = [
    "CELL_SIGNALS",
    "PHASES",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "SignalTable",
    "SignalTableError",
    "random_signal_table",
    *_LAZY,
]
