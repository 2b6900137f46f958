"""Scoring speed: the shared engine vs the per-entry path, side by side in one run, scores compared.

12 entries (FullKV, 4 uniform patterns, pyramid, 6 heterogeneous strategies) x N samples per task on
SmolLM2 at each context length. Reports wall and CPU seconds, the ratio, and whether every score matched;
also the H2O-vs-SnapKV entry cost on the shared engine (one uniform entry alone, interleaved A B B A), and
the *ceiling* of batching on this machine: the unmodified model making the same calls over ``--budget``-token
caches (no eviction work) once per entry one row at a time, vs one context pass plus one batch of all
entries. It is set by how much cheaper a 12-row step is than 12 one-row steps. A second ceiling
(``real_lengths``) has the FullKV entry hold the whole context, as it does in both engines; the
engine's share of each is reported.

Everything is measured sample by sample: each sample's shared-engine run, per-entry run (their order
alternating) and ceiling calls follow each other, so a machine whose speed drifts over minutes moves the
engines and their ceiling alike; ``--rounds R`` repeats the pass and reports each round's shares beside
the total's.

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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ceiling_stats import interval_text, paired_interval, ratio_of_sums, share_of_sums, verdict  # noqa: E402

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


def ceiling_sample(model, tok, task, sample, n_entries: int, budget: int, n_full: int = 0) -> dict:
    """The batching ceiling on this machine for one sample, entries holding ``budget`` tokens: the unmodified
    model (no eviction work) making the sample's calls once per entry one row at a time (``per_entry_s``),
    vs one context pass plus one ``n_entries``-row batch of the same calls (``shared_s``). After the (timed)
    context pass, the calls run over a ``budget``-token cache (the context's last tokens, built untimed).
    Generated tasks decode their full limit (no EOS).

    ``real_per_entry_s`` / ``real_shared_s`` are the same with each of the ``n_full`` FullKV entries holding
    the whole context: one row at a time it decodes over the context; batched, the best of one
    ``n_entries``-row batch padded to the context and two batches (the others over ``budget`` tokens, the
    FullKV rows over the context)."""
    eos = frozenset(eos_token_ids(model, tok))
    dev = next(model.parameters()).device
    job = scoring.engine.sample_job(tok, task, sample, eos, None)

    def ids(rows, tokens):
        return torch.tensor([list(tokens)] * rows, dtype=torch.long, device=dev)

    def timed_calls(rows: int, keep: int = budget) -> float:
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

    out = {}
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(input_ids=ids(1, job.context_ids), cache=DynamicCache(), use_cache=True, logits_to_keep=1)
        context_s = time.perf_counter() - t0
        one, many = timed_calls(1), timed_calls(n_entries)
        out["per_entry_s"] = n_entries * (context_s + one)
        out["shared_s"] = context_s + many
        if n_full:
            whole = len(job.context_ids)
            full_one = timed_calls(1, whole)
            out["real_per_entry_s"] = n_full * (context_s + full_one) + (n_entries - n_full) * (context_s + one)
            padded = timed_calls(n_entries, whole)
            split = timed_calls(n_entries - n_full) + timed_calls(n_full, whole)
            out["real_shared_s"] = context_s + min(padded, split)
    return out


def ceiling_report(parts: list[dict], budget: int, n_full: int) -> dict:
    """The ceiling over samples (sums of :func:`ceiling_sample`'s times), in the JSON's layout."""
    total = {k: sum(p[k] for p in parts) for k in parts[0]}
    out = {"budget": budget, "per_entry_s": total["per_entry_s"], "shared_s": total["shared_s"]}
    out["ratio"] = out["per_entry_s"] / out["shared_s"]
    if n_full:
        real = {"per_entry_s": total["real_per_entry_s"], "shared_s": total["real_shared_s"]}
        out["real_lengths"] = {"full_entries": n_full, **real, "ratio": real["per_entry_s"] / real["shared_s"]}
    return out


def shares(per_entry_s: float, shared_s: float, bound: dict) -> dict:
    """The engine's speed-up as a share of each ceiling, and each engine's time over its own side of the
    (FullKV-holding, when measured) ceiling: a share moved by one engine's run alone shows there."""
    ratio = per_entry_s / shared_s
    out = {"budget-length": ratio / bound["ratio"]}
    if "real_lengths" in bound:
        out["real_lengths"] = ratio / bound["real_lengths"]["ratio"]
    real = bound.get("real_lengths", bound)
    over = {"shared": shared_s / real["shared_s"], "per-entry": per_entry_s / real["per_entry_s"]}
    return {"share_of_ceiling": out, "over_ceiling_time": over}


def per_sample_scores(records):
    return [
        [(t, [r["score"] for r in res["per_sample"]]) for t, res in sorted(rec["tasks"].items())] for rec in records
    ]


def engines_beside_ceiling(model, tok, es, samples, rounds: int, budget: int, n: int) -> dict:
    """Both engines and the ceiling, sample by sample: for each sample the shared engine and the per-entry
    path (their order alternating from sample to sample) and then the unmodified model's calls, so that a
    machine whose speed drifts over minutes moves all four alike. ``rounds`` passes over the samples; the
    shares are reported per round and over all of them."""
    n_full = sum(e.strategy.is_full for e in es)
    runs: dict[str, list[dict]] = {"shared": [], "per-entry": []}
    parts, same, per_round, units = [], True, [], []
    for r in range(rounds):
        total = {e: {"wall_s": 0.0, "cpu_s": 0.0} for e in runs}
        round_parts = []
        flat = [(name, task, sample) for name, (task, ss) in samples.items() for sample in ss]
        for i, (name, task, sample) in enumerate(flat):
            one = {name: (task, [sample])}
            order = ("shared", "per-entry") if (i + r) % 2 == 0 else ("per-entry", "shared")
            scores, times = {}, {}
            for engine in order:
                rec, wall, cpu = timed(lambda: scoring.score_entries(model, tok, es, one, engine=engine))
                times[engine] = wall
                total[engine]["wall_s"] += wall
                total[engine]["cpu_s"] += cpu
                scores[engine] = per_sample_scores(rec)
            same &= scores["shared"] == scores["per-entry"]
            round_parts.append(ceiling_sample(model, tok, task, sample, len(es), budget, n_full))
            units.append((times, round_parts[-1]))
        for engine in runs:
            runs[engine].append(total[engine])
            print(
                f"context {n} round {r + 1}: {engine:9s} wall {total[engine]['wall_s']:7.1f} s  "
                f"cpu {total[engine]['cpu_s']:7.1f} s",
                flush=True,
            )
        bound = ceiling_report(round_parts, budget, n_full)
        per_round.append(shares(total["per-entry"]["wall_s"], total["shared"]["wall_s"], bound))
        print(f"context {n} round {r + 1}: " + share_text(per_round[-1]), flush=True)
        parts += round_parts
    wall = {e: sum(x["wall_s"] for x in runs[e]) for e in runs}
    cpu = {e: sum(x["cpu_s"] for x in runs[e]) for e in runs}
    bound = ceiling_report(parts, budget, n_full)
    out = {
        "runs": runs,
        "scores_identical": same,
        "speedup_wall": wall["per-entry"] / wall["shared"],
        "speedup_cpu": cpu["per-entry"] / cpu["shared"],
        "ceiling": bound,
        **shares(wall["per-entry"], wall["shared"], bound),
        "rounds": per_round,
        **unit_intervals(units, n_full),
    }
    real = bound.get("real_lengths")
    print(
        f"context {n}: ceiling of batching here (unmodified model, same calls): {bound['ratio']:.1f}x "
        f"({bound['per_entry_s']:.1f} s one row at a time vs {bound['shared_s']:.1f} s batched)"
        + (
            f"; with FullKV holding the context: {real['ratio']:.1f}x ({real['per_entry_s']:.1f} s vs "
            f"{real['shared_s']:.1f} s)"
            if real
            else ""
        ),
        flush=True,
    )
    print(
        f"context {n}: shared is {out['speedup_wall']:.1f}x faster (wall), {out['speedup_cpu']:.1f}x (cpu); "
        f"scores identical: {same}; " + share_text(out),
        flush=True,
    )
    print(f"context {n}: " + intervals_text(out), flush=True)
    return out


def unit_intervals(units: list[tuple[dict, dict]], n_full: int) -> dict:
    """95 % paired-bootstrap intervals over the (sample, round) units: the share of the ceiling (FullKV
    holding the context when measured) and the shared engine's time over the ceiling's batched side."""
    side = ("real_per_entry_s", "real_shared_s") if n_full else ("per_entry_s", "shared_s")
    shared = [t["shared"] for t, _ in units]
    ceiling_shared = [c[side[1]] for _, c in units]
    share = paired_interval(
        share_of_sums, [t["per-entry"] for t, _ in units], shared, [c[side[0]] for _, c in units], ceiling_shared
    )
    over = paired_interval(ratio_of_sums, shared, ceiling_shared)
    return {"intervals": {"share_of_ceiling": share, "shared_over_ceiling": over, "target": verdict(over)}}


def intervals_text(out: dict) -> str:
    iv = out["intervals"]
    return (
        f"share of the ceiling {interval_text(iv['share_of_ceiling'], '')}; shared over the ceiling's batched "
        f"side {interval_text(iv['shared_over_ceiling'])}: {iv['target']}"
    )


def shared_beside_ceiling(model, tok, es, samples, budget: int) -> dict:
    """The shared engine alone, each sample's run followed at once by the unmodified model's batched calls
    (:func:`ceiling_sample`, FullKV entries holding the context): its time over the ceiling's batched side,
    which a machine drifting over minutes moves little (to compare two commits without the per-entry path)."""
    n_full = sum(e.strategy.is_full for e in es)
    cpu = 0.0
    walls, bounds = [], []
    for name, (task, ss) in samples.items():
        for sample in ss:
            _, w, c = timed(lambda: scoring.score_entries(model, tok, es, {name: (task, [sample])}))
            part = ceiling_sample(model, tok, task, sample, len(es), budget, n_full)
            walls.append(w)
            bounds.append(part["real_shared_s" if n_full else "shared_s"])
            cpu += c
    wall, bound = sum(walls), sum(bounds)
    over = paired_interval(ratio_of_sums, walls, bounds)
    target = verdict(over)
    print(
        f"shared    wall {wall:7.1f} s  cpu {cpu:7.1f} s; the ceiling's batched side {bound:7.1f} s: "
        f"{interval_text(over)} its time: {target}",
        flush=True,
    )
    return {
        "runs": {"shared": [{"wall_s": wall, "cpu_s": cpu}]},
        "ceiling_shared_s": bound,
        "over_ceiling": wall / bound,
        "over_ceiling_interval": over,
        "target": target,
        "per_sample": {"shared_wall_s": walls, "ceiling_shared_s": bounds},
    }


def share_text(s: dict) -> str:
    over = s["over_ceiling_time"]
    return (
        ", ".join(f"{100 * v:.0f} % of the {k.replace('_', '-')} ceiling" for k, v in s["share_of_ceiling"].items())
        + f" (time over the ceiling's own side: shared {over['shared']:.2f}x, per-entry {over['per-entry']:.2f}x)"
    )


def h2o_cost(model, tok, L: int, budget: int, samples, repeats: int, n: int) -> dict:
    """H2O vs SnapKV: one uniform entry alone on the shared engine, interleaved A B B A."""
    cost = {"h2o": [], "snapkv": []}
    for p in ["h2o", "snapkv", "snapkv", "h2o"] * (repeats // 2):
        entry = baseline(f"uniform:{p}", L, budget)
        _, wall, _ = timed(lambda: scoring.score_entries(model, tok, [entry], samples, fidelity=False))
        cost[p].append(wall)
    ratio = min(cost["h2o"]) / min(cost["snapkv"]) if cost["h2o"] else None
    if ratio is not None:
        print(
            f"context {n}: h2o/snapkv entry cost {ratio:.2f}x (best of {len(cost['h2o'])} each: "
            f"{min(cost['h2o']):.1f} s vs {min(cost['snapkv']):.1f} s)",
            flush=True,
        )
    return {"h2o_s": cost["h2o"], "snapkv_s": cost["snapkv"], "h2o_over_snapkv": ratio}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
        help="only the shared engine, each sample beside the ceiling's batched calls: its time over the "
        "ceiling's (e.g. to compare two commits; no per-entry path or H2O cost)",
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="passes over the samples, each sample's runs interleaved (default 1)"
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
        count = sum(len(s) for _, s in samples.values())
        if args.shared_only:
            report["contexts"][str(n)] = {
                "samples": count,
                **shared_beside_ceiling(model, tok, es, samples, args.budget),
            }
            continue
        ctx = {"samples": count}
        if not args.h2o_only:
            ctx.update(engines_beside_ceiling(model, tok, es, samples, args.rounds, args.budget, n))
        ctx.update(h2o_cost(model, tok, L, args.budget, samples, args.h2o_repeats, n))
        report["contexts"][str(n)] = ctx
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
