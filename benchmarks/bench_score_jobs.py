"""The shared engine beside its ceiling in the layout of ``score --jobs N``: N worker processes, each with
its share of the cores (``polykv_search.parallel.worker_threads``), each taking every N-th sample.

``bench_score.py --shared-only`` measures one process using every core. There the engine's own per-step
work (hooks, selection, compaction: small serial ops) leaves a core idle that the unmodified model's
matmuls keep busy, so the engine's time over the ceiling grows with the threads (1.22x at one thread,
1.47x at two on the same samples; docs/scoring.md). A study runs ``score --jobs 2`` instead, one thread per
worker: this script measures the engine against the unmodified model in that layout, each worker timing,
per sample, the shared engine's run and the ceiling's batched calls (FullKV holding the context;
``bench_score.ceiling_sample``), their order alternating from sample to sample. The pooled time over the
ceiling gets a 95 % paired-bootstrap interval over the samples and issue 29's verdict (at most 1.25x).

    python benchmarks/bench_score_jobs.py --contexts 512 --samples 2 --jobs 2 --out runs/bench_score_jobs.json

``--jobs 1`` is the one-process layout (every core in one process), for a comparison in the same terms.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from ceiling_stats import interval_text, paired_interval, ratio_of_sums, verdict  # noqa: E402

from polykv_search.io import write_json  # noqa: E402
from polykv_search.parallel import worker_threads  # noqa: E402


def shard_times(shard: int, jobs: int, threads: int | None, context: int, n: int, suite: str, budget: int, device: str):
    """In a worker: every ``jobs``-th sample from ``shard`` on, the shared engine's wall time and the
    ceiling's batched side for each, in alternating order (even samples engine first)."""
    for p in (str(HERE.parent), str(HERE)):  # a fresh worker process does not have the script's path
        if p not in sys.path:
            sys.path.insert(0, p)
    import torch
    from bench_score import ceiling_sample, entries, timed

    from polykv_search import scoring
    from polykv_search.models import load_model

    if threads:
        torch.set_num_threads(threads)
    model, tok = load_model(device=device)
    es = entries(model.config.num_hidden_layers, budget, None)
    n_full = sum(e.strategy.is_full for e in es)
    texts, _ = scoring.eval_texts("austen")
    warm = scoring.make_task_samples(
        tok, scoring.resolve_tasks("broad/continuation"), texts, n_samples=1, context_len=256, seed=9
    )
    scoring.score_entries(model, tok, es[:2], warm)  # first calls pay one-off start-up costs
    samples = scoring.make_task_samples(
        tok, scoring.resolve_tasks(suite), texts, n_samples=n, context_len=context, seed=0
    )
    units = [(name, task, s) for name, (task, ss) in samples.items() for s in ss][shard::jobs]
    out = []
    for k, (name, task, sample) in enumerate(units):

        def engine():
            return timed(lambda: scoring.score_entries(model, tok, es, {name: (task, [sample])}))[1]

        def ceiling():
            part = ceiling_sample(model, tok, task, sample, len(es), budget, n_full)
            return part["real_shared_s" if n_full else "shared_s"]

        if k % 2 == 0:
            e, c = engine(), ceiling()
        else:
            c, e = ceiling(), engine()
        out.append({"task": name, "shard": shard, "engine_s": e, "ceiling_s": c})
    return out


def pooled(units: list[dict]) -> dict:
    """The engine's summed time over the ceiling's, with its interval over the units and the verdict."""
    walls = [u["engine_s"] for u in units]
    bounds = [u["ceiling_s"] for u in units]
    over = paired_interval(ratio_of_sums, walls, bounds)
    return {
        "engine_s": sum(walls),
        "ceiling_s": sum(bounds),
        "over_ceiling_interval": over,
        "target": verdict(over),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--contexts", default="512", help="context lengths, comma-separated (default 512)")
    ap.add_argument("--samples", type=int, default=2, help="samples per task (default 2)")
    ap.add_argument("--suite", default="broad,ruler")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2; 1: one process)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="runs/bench_score_jobs.json")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.samples < 1:
        ap.error("--jobs and --samples must be at least 1")
    from joblib import Parallel, delayed

    threads = worker_threads("loky", args.jobs)
    report = {"model": "smollm2-135m", "device": args.device, "jobs": args.jobs, "threads_per_worker": threads}
    report["contexts"] = {}
    for n in [int(c) for c in args.contexts.split(",")]:
        t0 = time.perf_counter()
        job = delayed(shard_times)
        parts = Parallel(n_jobs=args.jobs, backend="loky")(
            job(i, args.jobs, threads, n, args.samples, args.suite, args.budget, args.device) for i in range(args.jobs)
        )
        units = [u for part in parts for u in part]
        ctx = {"samples": len(units), "wall_s": time.perf_counter() - t0, **pooled(units), "units": units}
        report["contexts"][str(n)] = ctx
        print(
            f"context {n}, {args.jobs} worker(s) x {threads} thread(s), {len(units)} samples: engine "
            f"{ctx['engine_s']:.1f} s, the ceiling's batched side {ctx['ceiling_s']:.1f} s: "
            f"{interval_text(ctx['over_ceiling_interval'])} its time: {ctx['target']}",
            flush=True,
        )
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
