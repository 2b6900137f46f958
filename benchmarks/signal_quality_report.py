"""What ``bench_signal_quality.py`` reports: per-grid standard-error summaries over common cells, the machine's
load, and the SE-vs-CPU-minutes plot. Split out of the benchmark script, which runs the grids.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

SIGNALS = ("kl", "dppl", "cosine")
FULL_VALUE = {"kl": 0.0, "dppl": 0.0, "cosine": 1.0}


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def se_summary(table, common: np.ndarray | None = None) -> dict:
    """Per signal: SE quantiles over the collected cells (or the ``common`` mask), indistinguishable share."""
    out = {}
    for name in SIGNALS:
        value, se = table.signal_array(name), table.se_array(name)
        mask = np.isfinite(value) & np.isfinite(se)
        if common is not None:
            mask &= common
        if not mask.any():
            out[name] = None
            continue
        lo, hi = table.interval(name)
        full = FULL_VALUE[name]
        with np.errstate(invalid="ignore"):
            tie = ((lo <= full) & (hi >= full))[mask]
        s = se[mask]
        out[name] = {
            "cells": int(mask.sum()),
            "median_se": float(np.median(s)),
            "mean_se": float(np.mean(s)),
            "p90_se": float(np.quantile(s, 0.9)),
            "median_relative_se": float(np.median(s / np.maximum(np.abs(value[mask]), 1e-12))),
            "share_indistinguishable_from_full": float(tie.mean()),
        }
    return out


def cell_mask(table, reference) -> np.ndarray:
    """``reference``-shaped mask of the cells ``table`` has (by layer, phase, pattern and budget)."""
    mask = np.zeros(reference.cell_shape, dtype=bool)
    have = np.isfinite(table.signal_array("kl"))
    for f, phase in enumerate(reference.phases):
        for p, pattern in enumerate(reference.patterns):
            for b, budget in enumerate(reference.budgets):
                if phase in table.phases and pattern in table.patterns and budget in table.budgets:
                    idx = (
                        slice(None),
                        table.phase_index(phase),
                        table.pattern_index(pattern),
                        table.budget_index(budget),
                    )
                    mask[:, f, p, b] = have[idx]
    return mask


def lift(common: np.ndarray, reference, table) -> np.ndarray:
    """``common`` (on ``reference``'s axes) on ``table``'s axes."""
    out = np.zeros(table.cell_shape, dtype=bool)
    for f, phase in enumerate(table.phases):
        for p, pattern in enumerate(table.patterns):
            for b, budget in enumerate(table.budgets):
                if phase in reference.phases and pattern in reference.patterns and budget in reference.budgets:
                    idx = (
                        slice(None),
                        reference.phase_index(phase),
                        reference.pattern_index(pattern),
                        reference.budget_index(budget),
                    )
                    out[:, f, p, b] = common[idx]
    return out


def plot(results: list[dict], path: Path, minutes_key: str, minutes_label: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError:
        print("matplotlib is not importable: no plot", flush=True)
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, name, label in ((axes[0], "kl", "KL(FullKV ‖ cell)"), (axes[1], "dppl", "ΔPPL")):
        for r in results:
            s = (r.get("common_cells") or r["all_cells"]).get(name)
            if not s:
                continue
            x, y = max(r[minutes_key], 1e-3), s["median_se"]
            marker = "s" if r["evidence_samples"] else "o"
            ax.scatter([x], [y], marker=marker)
            ax.annotate(
                f"{r['grid']['name']} ({x:.3g}, {y:.2g})", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.tick_params(axis="x", which="both", labelrotation=30)
        ax.margins(0.2)
        ax.set_xlabel(minutes_label)
        ax.set_ylabel(f"median per-cell SE of {label}")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("Signal quality per compute (cells common to every grid; squares: retrieval mix)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
