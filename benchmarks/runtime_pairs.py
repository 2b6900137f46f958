"""Paired ratios for ``bench_runtime.py --paired-to PATTERN``: each pattern's configuration against the
same ``k`` and mode of ``PATTERN``, repeat by repeat.

The configurations of one repeat run back to back, so a ratio taken within a repeat cancels the machine's
drift between repeats (tens of percent on a shared CPU). Reported: the median of the per-repeat ratios
with a 95 % percentile bootstrap interval of that median (:func:`scipy.stats.bootstrap`, 9,999
resamples, seed 0); with fewer than 3 repeats, the median alone.
"""

from __future__ import annotations

import inspect

import numpy as np
from scipy import stats

LEVEL = 0.95
RESAMPLES = 9999
#: scipy < 1.15 names the generator ``random_state``
_RNG_KW = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def config_name(pattern: str, patterns: list[str], budget: int, k: int, mode: str) -> str:
    """The name ``bench_runtime.configurations`` gives a uniform pattern's configuration."""
    prefix = f"{pattern} " if len(patterns) > 1 else ""
    return f"{prefix}B{budget} k{k}" + (f" {mode}" if k > 1 else "")


def modes(k: int) -> tuple[str, ...]:
    """The interval modes measured at decoding interval ``k``."""
    return ("within", "over") if k > 1 else ("within",)


def pairs(patterns: list[str], budget: int, intervals: list[int], paired_to: str) -> dict[str, str]:
    """``{configuration: its counterpart of pattern paired_to}`` for every other pattern's configuration."""
    if paired_to not in patterns:
        raise ValueError(f"--paired-to {paired_to!r} is not one of --pattern {','.join(patterns)}")
    return {
        config_name(p, patterns, budget, k, mode): config_name(paired_to, patterns, budget, k, mode)
        for p in patterns
        if p != paired_to
        for k in intervals
        for mode in modes(k)
    }


def median_ratio(values: list[float], base: list[float]) -> dict:
    """The median over repeats of ``values[i] / base[i]``, with its bootstrap interval (None below 3
    repeats) and the per-repeat ratios."""
    ratios = np.asarray(values, dtype=float) / np.asarray(base, dtype=float)
    out = {"median": float(np.median(ratios)), "low": None, "high": None, "ratios": ratios.tolist()}
    if len(ratios) >= 3:
        res = stats.bootstrap(
            (ratios,),
            np.median,
            confidence_level=LEVEL,
            n_resamples=RESAMPLES,
            method="percentile",
            **{_RNG_KW: np.random.default_rng(0)},
        )
        out["low"], out["high"] = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return out


def paired(runs: dict[str, list[dict]], pairing: dict[str, str]) -> dict[str, dict]:
    """Per paired configuration: decode speed and prefill time over its counterpart's, repeat by repeat."""
    out = {}
    for name, base in pairing.items():
        rs, bs = runs[name], runs[base]
        out[name] = {
            "vs": base,
            "decode": median_ratio([r["decode_tok_s"] for r in rs], [b["decode_tok_s"] for b in bs]),
            "prefill": median_ratio([r["prefill_s"] for r in rs], [b["prefill_s"] for b in bs]),
        }
    return out


def text(x: dict) -> str:
    """``0.891 [0.871, 0.917]``, or the median alone."""
    if x["low"] is None:
        return f"{x['median']:.3f}"
    return f"{x['median']:.3f} [{x['low']:.3f}, {x['high']:.3f}]"
