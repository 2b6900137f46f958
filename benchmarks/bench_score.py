"""Scoring speed: the shared engine vs the per-entry path, side by side in one run, scores compared.

12 entries (FullKV, 4 uniform patterns, pyramid, 6 heterogeneous strategies) x N samples per task on
SmolLM2 at each context length; both engines run the same samples, interleaved (A B B A ...) so
machine noise hits both. Reports wall and CPU seconds, the ratio, and whether every score matched.
Also the H2O-vs-SnapKV entry cost on the shared engine (one uniform entry alone, interleaved), and the
*ceiling* of batching on this machine: the unmodified model making the same calls over ``--budget``-token
caches (no eviction work) once per entry one row at a time, vs one context pass plus one batch of all
entries. It is set by how much cheaper a 12-row step is than 12 one-row steps. A second ceiling
(``real_lengths``) has the FullKV entry hold the whole context, as it does in both engines; the
engine's share of each is reported.

    python benchmarks/bench_score.py --contexts 512,2048 --samples 1 --out runs/bench_score.json

Strategies: ``--strategies DIR`` scores the solver strategies in DIR (e.g. ``polykv-quickstart/strategies``,
6 files are taken); without it, 6 seeded heterogeneous strategies (random pattern per layer and phase,
budgets summing to L*B) stand in for them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polykv_search import scoring  # noqa: E402
from polykv_search.cli.baselines import baseline  # noqa: E402
from polykv_search.evaluation.runner import eos_token_ids  # noqa: E402
from polykv_search.io import write_json  # noqa: E402
from polykv_search.models import load_model  # noqa: E402
from strategies import PHASES, Strategy  # noqa: E402

UNIFORM = ("snapkv", "tova", "h2o", "streaming_llm")


def mixed(L: int, B: int, seed: int) -> Strategy:
    rng = random.Random(seed)
    layers = {}
    for phase in PHASES:
        weights = [rng.uniform(0.5, 1.5) for _ in range(L)]
        budgets = [max(8, int(L * B * w / sum(weights))) for w in weights]
        while sum(budgets) > L * B:
            budgets[budgets.index(max(budgets))] -= 1
        layers[phase] = [(rng.choice(UNIFORM), b) for b in budgets]
    return Strategy.from_choices(
        layers["prefill"], layers["decoding"], float(B), b_min=8, solver="synthetic", seed=seed
    )


def entries(L: int, B: int, strategies_dir: str | None) -> list[scoring.Entry]:
    out = [baseline("full", L, None)]
    out += [baseline(f"uniform:{p}", L, B) for p in UNIFORM]
    out.append(baseline("pyramid", L, B))
    if strategies_dir:
        paths = sorted(Path(strategies_dir).glob("*.json"))[:6]
        out += [scoring.Entry(p.stem, Strategy.load(p), "strategy", str(p)) for p in paths]
    else:
        out += [scoring.Entry(f"mixed-{k}", mixed(L, B, k), "strategy", "synthetic") for k in range(6)]
    return out


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - w, time.process_time() - c


def ceiling(model, tok, samples, n_entries: int, budget: int, n_full: int = 0) -> dict:
    """The batching ceiling on this machine for entries that hold ``budget`` tokens: the unmodified model
    (no eviction work) making every sample's calls once per entry one row at a time, vs one context pass
    plus one ``n_entries``-row batch of the same calls. After the (timed) context pass, the calls run
    over a ``budget``-token cache (the context's last tokens, built untimed). Generated tasks decode
    their full limit (no EOS).

    ``real_lengths`` is the same with each of the ``n_full`` FullKV entries holding the whole context:
    one row at a time it decodes over the context; batched, the best of one ``n_entries``-row batch
    padded to the context and two batches (the others over ``budget`` tokens, the FullKV rows over the
    context)."""
    eos = frozenset(eos_token_ids(model, tok))
    dev = next(model.parameters()).device

    def ids(rows, tokens):
        return torch.tensor([list(tokens)] * rows, dtype=torch.long, device=dev)

    def timed_calls(job, rows: int, keep: int = budget) -> float:
        if rows == 0:
            return 0.0
        cache = DynamicCache()
        model(input_ids=ids(rows, job.context_ids[-keep:]), cache=cache, use_cache=True, logits_to_keep=1)
        t0 = time.perf_counter()
        if job.teacher_forced:
            model(input_ids=ids(rows, job.target_ids[:-1]), cache=cache, use_cache=True)
        else:
            x = ids(rows, job.question_ids) if job.question_ids else ids(rows, job.context_ids[-1:])
            for _ in range(job.limit):
                out = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1)
                x = out.logits[:, -1:].argmax(-1)
        return time.perf_counter() - t0

    alone = batched = real_alone = real_batched = 0.0
    with torch.inference_mode():
        for task, task_samples in samples.values():
            for sample in task_samples:
                job = scoring.engine.sample_job(tok, task, sample, eos, None)
                t0 = time.perf_counter()
                model(input_ids=ids(1, job.context_ids), cache=DynamicCache(), use_cache=True, logits_to_keep=1)
                context_s = time.perf_counter() - t0
                one, many = timed_calls(job, 1), timed_calls(job, n_entries)
                alone += n_entries * (context_s + one)
                batched += context_s + many
                if n_full:
                    whole = len(job.context_ids)
                    full_one = timed_calls(job, 1, whole)
                    real_alone += n_full * (context_s + full_one) + (n_entries - n_full) * (context_s + one)
                    padded = timed_calls(job, n_entries, whole)
                    split = timed_calls(job, n_entries - n_full) + timed_calls(job, n_full, whole)
                    real_batched += context_s + min(padded, split)
    out = {"budget": budget, "per_entry_s": alone, "shared_s": batched, "ratio": alone / batched}
    if n_full:
        out["real_lengths"] = {
            "full_entries": n_full,
            "per_entry_s": real_alone,
            "shared_s": real_batched,
            "ratio": real_alone / real_batched,
        }
    return out


def per_sample_scores(records):
    return [
        [(t, [r["score"] for r in res["per_sample"]]) for t, res in sorted(rec["tasks"].items())] for rec in records
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--samples", type=int, default=1, help="samples per task (default 1)")
    ap.add_argument("--suite", default="broad,ruler")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--strategies", help="folder of solver strategy files (6 are used)")
    ap.add_argument("--h2o-repeats", type=int, default=2, help="H2O-vs-SnapKV runs of each (0: skip)")
    ap.add_argument("--h2o-only", action="store_true", help="only the H2O-vs-SnapKV entry cost")
    ap.add_argument(
        "--shared-only",
        action="store_true",
        help="only the shared engine's wall and CPU time (e.g. to compare two commits; no per-entry path, "
        "ceiling or H2O cost)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="runs/bench_score.json")
    args = ap.parse_args(argv)

    model, tok = load_model(device=args.device)
    L = model.config.num_hidden_layers
    es = entries(L, args.budget, args.strategies)
    texts, _ = scoring.eval_texts("austen")
    tasks = scoring.resolve_tasks(args.suite)
    report = {
        "model": "smollm2-135m",
        "device": args.device,
        "threads": torch.get_num_threads(),
        "entries": [e.name for e in es],
        "budget": args.budget,
        "contexts": {},
    }
    warm = scoring.make_task_samples(
        tok, scoring.resolve_tasks("broad/continuation"), texts, n_samples=1, context_len=256, seed=9
    )
    scoring.score_entries(model, tok, es[:2], warm)  # first calls pay one-off start-up costs
    for n in [int(c) for c in args.contexts.split(",")]:
        samples = scoring.make_task_samples(tok, tasks, texts, n_samples=args.samples, context_len=n, seed=0)
        runs = {"shared": [], "per-entry": []}
        records = {}
        engines = () if args.h2o_only else ("shared",) if args.shared_only else ("shared", "per-entry")
        for engine in engines:  # one each: the per-entry path is the slow one
            rec, wall, cpu = timed(lambda: scoring.score_entries(model, tok, es, samples, engine=engine))
            runs[engine].append({"wall_s": wall, "cpu_s": cpu})
            records[engine] = rec
            print(f"context {n}: {engine:9s} wall {wall:7.1f} s  cpu {cpu:7.1f} s", flush=True)
        if args.shared_only:
            report["contexts"][str(n)] = {"samples": sum(len(s) for _, s in samples.values()), "runs": runs}
            continue
        if len(records) == 2:
            same = per_sample_scores(records["shared"]) == per_sample_scores(records["per-entry"])
            ratio = runs["per-entry"][0]["wall_s"] / runs["shared"][0]["wall_s"]
            cpu_ratio = runs["per-entry"][0]["cpu_s"] / runs["shared"][0]["cpu_s"]
        else:
            same = ratio = cpu_ratio = None
        n_full = sum(e.strategy.is_full for e in es)
        bound = ceiling(model, tok, samples, len(es), args.budget, n_full)
        print(
            f"context {n}: ceiling of batching here (unmodified model, same calls): {bound['ratio']:.1f}x "
            f"({bound['per_entry_s']:.1f} s one row at a time vs {bound['shared_s']:.1f} s batched)",
            flush=True,
        )
        if "real_lengths" in bound:
            real = bound["real_lengths"]
            print(
                f"context {n}: ceiling with FullKV holding the context: {real['ratio']:.1f}x "
                f"({real['per_entry_s']:.1f} s vs {real['shared_s']:.1f} s)",
                flush=True,
            )
        # H2O vs SnapKV: one uniform entry alone on the shared engine, interleaved A B B A
        cost = {"h2o": [], "snapkv": []}
        order = ["h2o", "snapkv", "snapkv", "h2o"] * (args.h2o_repeats // 2)
        for p in order:
            entry = baseline(f"uniform:{p}", L, args.budget)
            _, wall, _ = timed(lambda: scoring.score_entries(model, tok, [entry], samples, fidelity=False))
            cost[p].append(wall)
        h2o_ratio = min(cost["h2o"]) / min(cost["snapkv"]) if cost["h2o"] else None
        report["contexts"][str(n)] = {
            "samples": sum(len(s) for _, s in samples.values()),
            "runs": runs,
            "scores_identical": same,
            "speedup_wall": ratio,
            "speedup_cpu": cpu_ratio,
            "h2o_s": cost["h2o"],
            "snapkv_s": cost["snapkv"],
            "h2o_over_snapkv": h2o_ratio,
            "ceiling": bound,
        }
        if ratio is not None:
            shares = {"budget-length": ratio / bound["ratio"]}
            if "real_lengths" in bound:
                shares["real_lengths"] = ratio / bound["real_lengths"]["ratio"]
            report["contexts"][str(n)]["share_of_ceiling"] = shares
            # each engine's time over its own side of the ceiling: a share moved by one engine's run alone
            # (the machine slower while it ran) shows here
            real = bound.get("real_lengths", bound)
            over = {
                "shared": runs["shared"][0]["wall_s"] / real["shared_s"],
                "per-entry": runs["per-entry"][0]["wall_s"] / real["per_entry_s"],
            }
            report["contexts"][str(n)]["over_ceiling_time"] = over
            print(
                f"context {n}: time over the ceiling's own side: shared {over['shared']:.2f}x, "
                f"per-entry {over['per-entry']:.2f}x",
                flush=True,
            )
            print(
                f"context {n}: shared is {ratio:.1f}x faster (wall), {cpu_ratio:.1f}x (cpu); scores identical: {same}; "
                + ", ".join(f"{100 * v:.0f} % of the {k.replace('_', '-')} ceiling" for k, v in shares.items()),
                flush=True,
            )
        if h2o_ratio is not None:
            print(
                f"context {n}: h2o/snapkv entry cost {h2o_ratio:.2f}x (best of {len(cost['h2o'])} each: "
                f"{min(cost['h2o']):.1f} s vs {min(cost['snapkv']):.1f} s)",
                flush=True,
            )
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
