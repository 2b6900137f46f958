"""Signal quality per CPU-minute (issue 11 §5): per-cell standard error against collection time.

Run (from the repository root)::

    python benchmarks/bench_signal_quality.py --out runs/signal_quality          # full size: hours on 2 cores
    python benchmarks/bench_signal_quality.py --smoke --out runs/signal_quality_smoke   # < 2 min: it works
    python benchmarks/bench_signal_quality.py --grid short:samples=16,context=512,continuation=32 --out DIR

Each *grid* is one ``collect`` on SmolLM2-135M over Austen's calibration novels: a number of samples of
``context + continuation`` tokens, budgets, patterns, layers and an optional retrieval mix
(``--retrieval-mix``, :mod:`polykv_search.data.evidence`). For every grid the script measures the
collection's wall and CPU time (``time.process_time``: every thread of this process, so torch's
intra-op threads count) and the per-cell standard errors the table carries (:mod:`signals.uncertainty`:
over (sample, token block) units), and reports per signal (KL, ΔPPL, cosine):

* the median, mean and 90th percentile of the cells' SE, over every collected cell and over the
  cells that every grid has (``common``: the same (layer, phase, pattern, budget), so grids of other
  shapes compare on equal cells);
* the share of cells whose 95 % interval contains the FullKV value (ΔPPL, KL: 0) — cells the
  calibration cannot tell from FullKV;
* ``se2_cpu_minutes = median SE² × CPU-minutes``: SE² falls as 1/units while time grows with the
  units, so this cost-normalised figure compares grid *shapes* (short vs long samples, budgets,
  patterns); lower is more signal per CPU-minute.

Output in ``--out``: ``signal_quality.json`` (every figure, the machine and its load) and
``signal_quality.png`` (median SE of KL and of ΔPPL against CPU-minutes, log-log, one point per grid;
wall minutes on a GPU). Each grid's table is kept (``<name>.signals.json``) with its collection journal,
and its figures (``<name>.result.json``), so an interrupted run continues where it stopped and finished
grids are not rerun (``--fresh`` reruns them). A resumed grid's times cover only the last run
(``resumed: true``); ``collect_compute_seconds`` sums every run's per-unit seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from signal_quality_report import cell_mask, lift, load_average, plot, se_summary  # noqa: E402

DEFAULT_PATTERNS = ("snapkv", "tova", "h2o", "streaming_llm", "knorm", "random")


@dataclass(frozen=True)
class Grid:
    """One collection to measure."""

    name: str
    samples: int = 8
    context: int = 1024
    continuation: int = 64
    budgets: tuple[int, ...] = (32, 64, 128, 256)
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    layers: str = "all"
    mix: str = "0"
    phases: tuple[str, ...] = field(default=("prefill", "decoding"))

    @property
    def tokens(self) -> int:
        return self.samples * (self.context + self.continuation)


#: The full-size study: the same token count (about 9k context tokens) spent three ways, then budgets,
#: patterns and a retrieval mix varied on the middle shape.
FULL_GRIDS = (
    Grid("many-short", samples=16, context=512, continuation=32),
    Grid("middle", samples=8, context=1024, continuation=64),
    Grid("few-long", samples=4, context=2048, continuation=128),
    Grid("middle-more-continuation", samples=8, context=1024, continuation=128),
    Grid("middle-2-budgets", samples=8, context=1024, continuation=64, budgets=(64, 256)),
    Grid("middle-3-patterns", samples=8, context=1024, continuation=64, patterns=("snapkv", "tova", "h2o")),
    Grid("middle-mix-0.5", samples=8, context=1024, continuation=64, mix="0.5"),
)
#: A smoke run (< 2 minutes on 2 cores): two layers, two patterns, two budgets.
SMOKE_GRIDS = (
    Grid(
        "smoke-short",
        samples=2,
        context=128,
        continuation=16,
        budgets=(32, 64),
        patterns=("snapkv", "h2o"),
        layers="0,15",
    ),
    Grid(
        "smoke-long",
        samples=1,
        context=256,
        continuation=32,
        budgets=(32, 64),
        patterns=("snapkv", "h2o"),
        layers="0,15",
    ),
    Grid(
        "smoke-mix",
        samples=2,
        context=128,
        continuation=16,
        budgets=(32, 64),
        patterns=("snapkv", "h2o"),
        layers="0,15",
        mix="1",
    ),
)


def parse_grid(text: str) -> Grid:
    """``NAME:key=value,...`` with keys samples, context, continuation, budgets (``32/64``),
    patterns (``snapkv/h2o``), layers (``0-3/10``), mix, phases (``prefill/decoding``)."""
    name, _, rest = text.partition(":")
    if not name or not rest:
        raise SystemExit(f"--grid {text!r}: expected NAME:key=value,... (e.g. short:samples=16,context=512)")
    kw: dict = {}
    for item in rest.split(","):
        key, _, value = item.partition("=")
        try:
            if key in ("samples", "context", "continuation"):
                kw[key] = int(value)
            elif key == "budgets":
                kw[key] = tuple(int(b) for b in value.split("/"))
            elif key in ("patterns", "phases"):
                kw[key] = tuple(value.split("/"))
            elif key == "layers":
                kw[key] = value.replace("/", ",")
            elif key == "mix":
                kw[key] = value
            else:
                raise SystemExit(f"--grid {text!r}: unknown key {key!r}")
        except ValueError:
            raise SystemExit(f"--grid {text!r}: bad value {value!r} for {key}") from None
    return Grid(name, **kw)


def run_grid(grid: Grid, model, tokenizer, corpus, out_dir: Path, seed: int, fresh: bool) -> tuple[dict, object]:
    from polykv_search.data import describe_samples
    from polykv_search.data.evidence import describe_evidence, make_calibration_samples, parse_retrieval_mix
    from signals.collect import collect_signals

    mix = parse_retrieval_mix(grid.mix)
    samples = make_calibration_samples(
        tokenizer,
        corpus,
        n_samples=grid.samples,
        context_len=grid.context,
        continuation_len=grid.continuation,
        seed=seed,
        mix=mix,
    )
    path = out_dir / f"{grid.name}.signals.json"
    done = out_dir / f"{grid.name}.result.json"
    if done.is_file() and path.is_file() and not fresh:
        from signals import SignalTable

        saved = json.loads(done.read_text())
        if saved.get("grid", {}).get("name") == grid.name and saved["grid"] == {**asdict(grid), "tokens": grid.tokens}:
            print(f"[{grid.name}] finished earlier: {done}", flush=True)
            return saved, SignalTable.load(path)
    print(
        f"[{grid.name}] {grid.samples} x {grid.context}+{grid.continuation} tokens, budgets {list(grid.budgets)}, "
        f"patterns {list(grid.patterns)}, layers {grid.layers}, mix {grid.mix}; load {load_average()}",
        flush=True,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    table = collect_signals(
        model,
        samples,
        patterns=grid.patterns,
        budgets=grid.budgets,
        phases=grid.phases,
        layers=grid.layers,
        out=path,
        fresh=fresh,
        progress=sys.stderr.isatty(),
        provenance={
            "calibration": describe_samples(
                samples,
                corpus,
                role="calib",
                seed=seed,
                spec="austen",
                context_len=grid.context,
                continuation_len=grid.continuation,
            ),
            "retrieval": describe_evidence(samples, mix),
        },
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    timings = table.provenance["timings"]
    result = {
        "grid": {**asdict(grid), "tokens": grid.tokens},
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "cpu_minutes": round(cpu / 60, 3),
        "resumed": bool(timings.get("resumed")),
        "collect_compute_seconds": timings.get("compute_seconds"),
        "se_dof": table.se_dof,
        "evidence_samples": table.retrieval["evidence_samples"],
        "full_ppl": table.full_ppl,
        "all_cells": se_summary(table),
        "load_after": load_average(),
    }
    done.write_text(json.dumps(result, indent=2) + "\n")
    kl = result["all_cells"]["kl"]
    print(
        f"[{grid.name}] {wall:.1f}s wall, {cpu / 60:.2f} CPU-min; median SE: KL {kl['median_se']:.3g}, "
        f"dPPL {result['all_cells']['dppl']['median_se']:.3g}",
        flush=True,
    )
    return result, table


def warm_up(model, tokenizer, corpus, patterns) -> float:
    """One small unmeasured collection first, so that one-off costs (first calls, lazy imports) do not
    land on the first grid's time. Returns its wall seconds."""
    from polykv_search.data import make_samples
    from signals.collect import collect_signals

    t0 = time.perf_counter()
    samples = make_samples(tokenizer, corpus, n_samples=1, context_len=64, continuation_len=4, seed=0)
    collect_signals(model, samples, patterns=patterns, budgets=[8], layers=[0], journal=False)
    return round(time.perf_counter() - t0, 2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (JSON, PNG, one signal table per grid)")
    p.add_argument("--smoke", action="store_true", help="the tiny grids (under 2 minutes): shows the script works")
    p.add_argument(
        "--grid",
        action="append",
        default=None,
        help="NAME:samples=8,context=1024,continuation=64,budgets=32/64,patterns=snapkv/h2o,layers=0-3,mix=0.5 "
        "(repeatable; replaces the default grids)",
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fresh", action="store_true", help="recollect every grid")
    args = p.parse_args(argv)
    grids = [parse_grid(g) for g in args.grid] if args.grid else list(SMOKE_GRIDS if args.smoke else FULL_GRIDS)
    if len({g.name for g in grids}) != len(grids):
        raise SystemExit("grid names must be distinct")

    import torch

    from polykv_search.data import load_corpus
    from polykv_search.models import load_model

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model, tokenizer = load_model(args.model, device=args.device)
    corpus = load_corpus("austen")
    warm = warm_up(model, tokenizer, corpus, sorted({p for g in grids for p in g.patterns}))
    results, tables = [], []
    for grid in grids:
        result, table = run_grid(grid, model, tokenizer, corpus, out_dir, args.seed, args.fresh)
        results.append(result)
        tables.append(table)
    common = np.ones(tables[0].cell_shape, dtype=bool)
    for t in tables:
        common &= cell_mask(t, tables[0])
    for r, t in zip(results, tables):
        r["common_cells"] = se_summary(t, lift(common, tables[0], t)) if common.any() else None
        kl = (r["common_cells"] or r["all_cells"])["kl"]
        r["se2_cpu_minutes"] = {"kl": kl["median_se"] ** 2 * r["cpu_minutes"]} if kl else None
    on_cpu = args.device == "cpu"
    minutes_key, label = ("cpu_minutes", "CPU-minutes (all threads)") if on_cpu else ("wall_minutes", "wall minutes")
    for r in results:
        r["wall_minutes"] = round(r["wall_seconds"] / 60, 3)
    report = {
        "model": args.model,
        "device": args.device,
        "smoke": args.smoke,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "common_cells": int(common.sum()),
        "warm_up_seconds": warm,
        "seconds_total": round(time.perf_counter() - started, 1),
        "grids": results,
    }
    (out_dir / "signal_quality.json").write_text(json.dumps(report, indent=2) + "\n")
    drew = plot(results, out_dir / "signal_quality.png", minutes_key, label)
    print(f"wrote {out_dir / 'signal_quality.json'}" + (f" and {out_dir / 'signal_quality.png'}" if drew else ""))
    print(f"{'grid':28} {'CPU-min':>8} {'wall s':>8} {'SE KL':>10} {'SE dPPL':>10} {'SE2*min':>10}")
    for r in results:
        c = r["common_cells"] or r["all_cells"]
        print(
            f"{r['grid']['name']:28} {r['cpu_minutes']:8.2f} {r['wall_seconds']:8.1f} {c['kl']['median_se']:10.3g} "
            f"{c['dppl']['median_se']:10.3g} {r['se2_cpu_minutes']['kl']:10.3g}"
        )
    return 0


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
