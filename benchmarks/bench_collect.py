"""Benchmark `polykv-search collect` on SmolLM2-135M: replay vs naive, and the full default grid.

Run (from the repository root; ~40 min on 2 loaded CPU cores)::

    python benchmarks/bench_collect.py --out bench_collect.json
    python benchmarks/bench_collect.py --part compare      # only part 1
    python benchmarks/bench_collect.py --part grid --grid-samples 2 --jobs 2

Part 1, **compare** — side by side in one run, on the same cells: 1 Austen calibration sample
(n=1024, m=128), layers 7 and 22 (the mean number of layers from l to the top, 15.5, equals the full
grid's, so the per-cell cost is representative), both phases, 6 patterns × 4 budgets = 96 cells.
Wall time of the replay and of the naive path (one full forward per cell, ``--naive``), the speed-up,
and the largest differences between the two tables (cosine, ΔPPL, entropy).

Part 2, **grid** — the full default grid (30 layers × 2 phases × 6 patterns × 4 budgets) at n=1024,
m=128 on ``--grid-samples`` of the 8 calibration samples (default 1): the measured wall time, and
the extrapolation to 8 samples (``× 8 / grid-samples``: every sample costs the same — one FullKV pass
and the same 60 units), labelled as such. The target is ≤ 15 min for 8 samples on 2 cores.

The machine's load average is printed before and after each part: other processes on the same
cores make every figure slower.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

PATTERNS = ("snapkv", "tova", "h2o", "streaming_llm", "knorm", "random")
BUDGETS = (32, 64, 128, 256)


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def max_abs(a, b) -> float:
    mask = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a[mask] - b[mask]))) if mask.any() else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["compare", "grid", "both"], default="both")
    p.add_argument("--context-len", type=int, default=1024)
    p.add_argument("--continuation-len", type=int, default=128)
    p.add_argument("--compare-layers", default="7,22")
    p.add_argument("--grid-samples", type=int, default=1, help="of the 8 samples, how many to run in part 2")
    p.add_argument("--jobs", type=int, default=1, help="part 2: joblib workers")
    p.add_argument("--grid-journal", default=None, help="part 2: keep a journal here (per-unit timings; resumable)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)

    from polykv_search.data import load_corpus, make_samples
    from polykv_search.models import load_model
    from signals.collect import collect_signals

    model, tokenizer = load_model()
    corpus = load_corpus("austen")
    samples = make_samples(
        tokenizer, corpus, n_samples=8, context_len=args.context_len, continuation_len=args.continuation_len, seed=0
    )
    results: dict = {
        "model": "smollm2-135m",
        "context_len": args.context_len,
        "continuation_len": args.continuation_len,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs", flush=True)

    if args.part in ("compare", "both"):
        layers = [int(x) for x in args.compare_layers.split(",")]
        kw = dict(patterns=PATTERNS, budgets=BUDGETS, layers=layers, journal=False, progress=True)
        cells = len(layers) * 2 * len(PATTERNS) * len(BUDGETS)
        print(
            f"[compare] {cells} cells (layers {layers}, 2 phases, {len(PATTERNS)} patterns x {len(BUDGETS)} "
            f"budgets), 1 sample of {args.context_len}+{args.continuation_len}; load {load()}",
            flush=True,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        fast = collect_signals(model, samples[:1], **kw)
        t_fast, c_fast = time.perf_counter() - t0, time.process_time() - c0
        print(f"[compare] replay: {t_fast:.1f}s wall, {c_fast:.1f}s CPU; load {load()}", flush=True)
        t0, c0 = time.perf_counter(), time.process_time()
        slow = collect_signals(model, samples[:1], naive=True, **kw)
        t_slow, c_slow = time.perf_counter() - t0, time.process_time() - c0
        print(f"[compare] naive:  {t_slow:.1f}s wall, {c_slow:.1f}s CPU; load {load()}", flush=True)
        diff = {
            "cosine": max_abs(fast.cosine_array(), slow.cosine_array()),
            "dppl": max_abs(fast.dppl_array(), slow.dppl_array()),
            "dppl_relative_to_full_ppl": max_abs(fast.dppl_array(), slow.dppl_array()) / slow.full_ppl,
            "entropy": max_abs(fast.entropy_array(), slow.entropy_array()),
            "full_ppl": abs(fast.full_ppl - slow.full_ppl),
        }
        results["compare"] = {
            "cells": cells,
            "layers": layers,
            "replay_seconds": round(t_fast, 2),
            "naive_seconds": round(t_slow, 2),
            "speedup": round(t_slow / t_fast, 2),
            "replay_cpu_seconds": round(c_fast, 2),
            "naive_cpu_seconds": round(c_slow, 2),
            "speedup_cpu": round(c_slow / c_fast, 2),
            "max_abs_difference": diff,
            "full_ppl": slow.full_ppl,
        }
        print(
            f"[compare] speed-up {t_slow / t_fast:.1f}x wall, {c_slow / c_fast:.1f}x CPU (target >= 10x); "
            "max |difference|: " + ", ".join(f"{k} {v:.2e}" for k, v in diff.items()),
            flush=True,
        )

    if args.part in ("grid", "both"):
        k = max(1, min(8, args.grid_samples))
        print(
            f"[grid] full default grid (30 layers x 2 phases x 6 patterns x 4 budgets) on {k} of 8 samples, "
            f"jobs={args.jobs}; load {load()}",
            flush=True,
        )
        loader = None
        if args.jobs > 1:
            from signals.collect import ModelLoader

            loader = ModelLoader("smollm2-135m")
        t0, c0 = time.perf_counter(), time.process_time()
        table = collect_signals(
            model,
            samples[:k],
            patterns=PATTERNS,
            budgets=BUDGETS,
            progress=True,
            jobs=args.jobs,
            model_loader=loader,
            journal=args.grid_journal or False,
        )
        t, c = time.perf_counter() - t0, time.process_time() - c0
        extrapolated = t * 8 / k
        results["grid"] = {
            "samples_measured": k,
            "measured_seconds": round(t, 1),
            "measured_cpu_seconds_this_process": round(c, 1),
            "extrapolated_seconds_8_samples": round(extrapolated, 1),
            "extrapolation": f"measured on {k}/8 samples, x {8 / k:g} (every sample costs the same)",
            "jobs": args.jobs,
            "full_pass_seconds": table.provenance["timings"]["full_pass_seconds"],
            "complete": bool(table.is_complete()),
        }
        print(
            f"[grid] measured {t:.0f}s for {k} sample(s); EXTRAPOLATED to 8 samples: {extrapolated / 60:.1f} min "
            f"(target <= 15 min); load {load()}",
            flush=True,
        )

    results["load_after"] = load()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
