"""Decode-suite cost per sample: today's path vs the batched one, side by side in one run, results compared.

Today's path (the reference, ``fullkv_apart``): per sample, FullKV greedy-decodes its N tokens alone, then the
entries are teacher-forced along them as one batch. The batched path (:mod:`polykv_search.scoring.trajectories`):
FullKV is a row of the entries' batch, and ``--decode-batch`` samples of one prompt length step together, with
SnapKV's window attention kept between steps (``SnapKV.incremental``; today's path recomputes it at every step,
as the code before it did). ``--with-recomputed`` adds the batched path with the window recomputed, so the run
also shows what the kept window saves. ``--strategy FILE`` (repeatable) adds strategy files to the entries, e.g.
head-group ones; ``--with-unshared`` adds the batched path with every head-group row in stores of its own
(:func:`~polykv_search.runtime.layouts.row_parts` alone, as before :mod:`polykv_search.scoring.stacking`), so the
run also shows what sharing row batches across rows of one head split saves.
Entries as in the decode study (issue 27): FullKV, 4 uniform patterns and 3 seeded heterogeneous strategies
(stand-ins for ilp and its ablations) at each budget, so 15 entries at two budgets. The two paths run one after
the other (``--order`` picks which first) on the same samples; the run reports each one's wall seconds per
sample, the ratio, and whether every record matched (agreement counts, answers and KV bytes equal; KL within
rel 1e-3).

    python benchmarks/bench_decode.py --samples 4 --generate-len 64 --out runs/bench_decode.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_score import UNIFORM, mixed  # noqa: E402

from polykv_search import scoring  # noqa: E402
from polykv_search.cli.baselines import baseline  # noqa: E402
from polykv_search.io import write_json  # noqa: E402
from polykv_search.models import load_model  # noqa: E402
from polykv_search.patterns.snapkv import SnapKV  # noqa: E402
from polykv_search.runtime.layouts import row_parts  # noqa: E402
from polykv_search.scoring import shared  # noqa: E402
from polykv_search.scoring.engine import RunnerSettings, SampleRunner  # noqa: E402
from strategies import Strategy  # noqa: E402

#: Each path: its runner settings, whether SnapKV keeps its window attention between steps, and whether rows of
#: one head split share row batches (:func:`polykv_search.scoring.stacking.stacked_layer`).
PATHS = {
    "today": ({"decode_batch": 1, "fullkv_apart": True}, False, True),
    "batched": ({}, True, True),
    "batched-recomputed": ({}, False, True),
    "batched-unshared": ({}, True, False),
}


def study_entries(L: int, budgets: list[int]) -> list[scoring.Entry]:
    out = [baseline("full", L, None)]
    for B in budgets:
        for p in UNIFORM:
            out.append(scoring.Entry(f"uniform-{p}-{B}", baseline(f"uniform:{p}", L, B).strategy, "baseline", p))
        out += [scoring.Entry(f"mixed-{k}-{B}", mixed(L, B, k), "strategy", "synthetic") for k in range(3)]
    return out


def run_path(
    model, tok, entries, task_samples, settings: RunnerSettings, incremental: bool = True, share: bool = True
) -> tuple[list, float, float]:
    """Every sample's rows, wall and CPU seconds, through the runner ``score_entries`` uses (``incremental``:
    SnapKV keeps its window attention between steps; ``share``: rows of one head split share row batches)."""
    rows = []
    SnapKV.incremental = incremental
    stacked = shared.stacked_layer
    if not share:
        shared.stacked_layer = row_parts
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        with SampleRunner(model, tok, entries, settings) as runner:
            for task, samples in task_samples.values():
                for chunk in runner.chunks([(task, i, s) for i, s in enumerate(samples)]):
                    rows += runner.run_many(task, [s for _, _, s in chunk])
        return rows, time.perf_counter() - wall, time.process_time() - cpu
    finally:
        SnapKV.incremental = True
        shared.stacked_layer = stacked


def mismatches(reference: list, got: list, names: list[str]) -> list[str]:
    """Where a record of ``got`` differs from the reference's (empty: every one matched)."""
    bad = []
    for k, (ref, new) in enumerate(zip(reference, got)):
        for name, r, g in zip(names, ref, new):
            a, b = r["record"]["prediction"], g["record"]["prediction"]
            same = (
                a["agree_tokens"] == b["agree_tokens"]
                and a.get("answer") == b.get("answer")
                and r["record"]["kv_bytes"] == g["record"]["kv_bytes"]
                and abs(a["kl"] - b["kl"]) <= 1e-3 * abs(a["kl"]) + 1e-6
            )
            if not same:
                bad.append(f"sample {k} {name}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--samples", type=int, default=4, help="samples per task (default 4)")
    ap.add_argument("--generate-len", type=int, default=64, help="tokens FullKV generates (default 64)")
    ap.add_argument("--context-len", type=int, default=320, help="prompt tokens (default 320, the study's)")
    ap.add_argument("--suite", default="decode/trajectory", help="tasks (default decode/trajectory)")
    ap.add_argument("--budgets", default="64,128", help="budgets of the entries (default 64,128)")
    ap.add_argument("--decode-batch", type=int, default=8, help="batched path: samples per batch (default 8)")
    ap.add_argument("--order", choices=["today-first", "batched-first"], default="today-first")
    ap.add_argument(
        "--with-recomputed", action="store_true", help="also run the batched path with SnapKV's window recomputed"
    )
    ap.add_argument("--strategy", action="append", default=[], metavar="FILE", help="a strategy file to add")
    ap.add_argument("--with-unshared", action="store_true", help="also run the batched path with head-group rows apart")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", help="JSON report")
    args = ap.parse_args(argv)
    if min(args.samples, args.generate_len - 1, args.decode_batch) < 1:
        print("bench_decode: --samples and --decode-batch must be positive, --generate-len at least 2", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model()
    L = model.config.num_hidden_layers
    entries = study_entries(L, [int(b) for b in args.budgets.split(",")] if args.budgets else [])
    entries += [scoring.Entry(Path(p).stem, Strategy.load(p), "strategy", "file") for p in args.strategy]
    texts, _ = scoring.eval_texts("austen")
    tasks = scoring.resolve_tasks(args.suite, generate_len=args.generate_len)
    task_samples = scoring.make_task_samples(
        tok, tasks, texts, n_samples=args.samples, context_len=args.context_len, seed=0
    )
    count = sum(len(s) for _, s in task_samples.values())
    paths = ["today", "batched"] + (["batched-recomputed"] if args.with_recomputed else [])
    paths += ["batched-unshared"] if args.with_unshared else []
    order = paths if args.order == "today-first" else list(reversed(paths))
    results = {}
    for name in order:
        extra, incremental, share = PATHS[name]
        settings = RunnerSettings(**{"decode_batch": args.decode_batch, **extra})
        rows, wall, cpu = run_path(model, tok, entries, task_samples, settings, incremental, share)
        results[name] = {"rows": rows, "wall_s": wall, "cpu_s": cpu, "wall_per_sample_s": wall / count}
    names = [e.name for e in entries]
    reference = results["today"]["rows"]
    bad = [f"{name}: {m}" for name in paths[1:] for m in mismatches(reference, results[name]["rows"], names)]
    report = {
        "model": "smollm2-135m",
        "threads": torch.get_num_threads(),
        "entries": [e.name for e in entries],
        "suite": args.suite,
        "samples": count,
        "generate_len": args.generate_len,
        "context_len": args.context_len,
        "decode_batch": args.decode_batch,
        "order": order,
        **{name: {k: v for k, v in r.items() if k != "rows"} for name, r in results.items()},
        "ratio_wall": results["today"]["wall_s"] / results["batched"]["wall_s"],
        "ratio_cpu": results["today"]["cpu_s"] / results["batched"]["cpu_s"],
        **(
            {"ratio_cpu_recomputed": results["today"]["cpu_s"] / results["batched-recomputed"]["cpu_s"]}
            if args.with_recomputed
            else {}
        ),
        **(
            {"ratio_cpu_unshared": results["batched-unshared"]["cpu_s"] / results["batched"]["cpu_s"]}
            if args.with_unshared
            else {}
        ),
        "mismatches": bad,
    }
    print(f"{len(entries)} entries, {count} samples, N = {args.generate_len}, {report['threads']} thread(s)")
    print(f"{'path':<20}{'wall s':>10}{'s/sample':>10}{'cpu s':>10}")
    for name in paths:
        r = results[name]
        print(f"{name:<20}{r['wall_s']:>10.1f}{r['wall_per_sample_s']:>10.1f}{r['cpu_s']:>10.1f}")
    print(f"ratio (today / batched): wall {report['ratio_wall']:.2f}x, cpu {report['ratio_cpu']:.2f}x")
    if args.with_recomputed:
        print(f"ratio (today / batched-recomputed): cpu {report['ratio_cpu_recomputed']:.2f}x")
    if args.with_unshared:
        print(f"ratio (batched-unshared / batched): cpu {report['ratio_cpu_unshared']:.2f}x")
    print("records: all equal" if not bad else f"records differ: {', '.join(bad[:8])}")
    if args.out:
        write_json(args.out, report)
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
