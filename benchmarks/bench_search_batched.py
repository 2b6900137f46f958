"""The whole-model search's objective, batched (the scoring engine) vs one strategy at a time, side by side.

One calibration sample of SmolLM2 (Austen, calibration split), the starts of a search at B = 128 (uniform
``kvzip[allocation=model]`` and a head-level strategy file) and ``--neighbors`` moves around the head-level
start. The batched path measures all of them in one call (its FullKV reference row included); the
one-at-a-time path (the reference path) then runs the FullKV reference and each strategy alone, and starts no
run that would likely end past ``--deadline`` seconds from the start of the benchmark (a strategy it did not
reach is not reported). Prints
JSON: wall seconds of both, per-strategy values and their largest relative difference, and ``uptime`` before
and after (this machine is shared).

    python benchmarks/bench_search_batched.py --start studies/quickstart/2026-12-06-ilp-head-B128.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polykv_search.data import load_corpus, make_samples  # noqa: E402
from polykv_search.models import load_model  # noqa: E402
from signals.strategy_kl import fullkv_reference  # noqa: E402
from solvers import Problem  # noqa: E402
from solvers.search_objective import SearchJournal, WholeModelObjective  # noqa: E402
from solvers.search_space import SearchSpace  # noqa: E402
from solvers.uniform import UniformSettings, UniformSolver  # noqa: E402
from strategies import Strategy  # noqa: E402

POOL = "kvzip[allocation=model]"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def strategies(start: Path, neighbors: int, budget: int, b_min: int, layers: int) -> list[tuple[str, Strategy]]:
    """The two starts, then the first ``neighbors`` moves of the head-level start in a seeded order."""
    p = Problem(global_budget=budget, num_layers=layers, patterns=[POOL, "snapkv"], b_min=b_min, phases=["prefill"])
    head = Strategy.load(start)
    out = [("uniform-" + POOL, UniformSolver(UniformSettings(pattern=POOL)).solve(p).strategy), (start.stem, head)]
    space = SearchSpace(p, head, blocks=6, step=max(1, budget // 4), patterns=p.patterns)
    moves = space.moves(head)
    for idx in np.random.default_rng([0, 0]).permutation(len(moves)):
        if len(out) == 2 + neighbors:
            break
        moved = space.apply(head, moves[int(idx)])
        if moved is not None and moved.digest() != head.digest():
            out.append((moves[int(idx)].label(space.blocks), moved))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=Path, required=True, help="head-level strategy file (B = --budget)")
    ap.add_argument("--neighbors", type=int, default=2)
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--b-min", type=int, default=16)
    ap.add_argument("--context-len", type=int, default=512)
    ap.add_argument("--continuation-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=345.0, help="end the one-at-a-time path by this (s)")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    before = uptime()
    model, tok = load_model()
    sample = make_samples(
        tok,
        load_corpus("austen"),
        n_samples=1,
        context_len=args.context_len,
        continuation_len=args.continuation_len,
        seed=args.seed,
    )
    named = strategies(args.start, args.neighbors, args.budget, args.b_min, model.config.num_hidden_layers)
    key = {"model": "smollm2", "model_fingerprint": "-", "samples": {"n": 1}, "definition": "-"}
    batched = WholeModelObjective(model, sample, SearchJournal.open(None, key), batched=True)
    t0 = time.perf_counter()
    got = batched([s for _, s in named])[0]
    batched_s = time.perf_counter() - t0
    naive = WholeModelObjective(model, sample, SearchJournal.open(None, key), batched=False)
    t0 = time.perf_counter()
    naive.references[0] = fullkv_reference(model, sample[0])  # timed apart from the strategies
    reference_s = time.perf_counter() - t0
    want, naive_s = [], []
    print(f"batched {batched_s:.1f} s, FullKV reference alone {reference_s:.1f} s", file=sys.stderr, flush=True)
    for name, strategy in named:
        if time.perf_counter() - began + max(naive_s, default=0.0) > args.deadline:
            break  # the next run would likely end past the deadline
        t0 = time.perf_counter()
        want.append(float(naive([strategy])[0, 0]))
        naive_s.append(time.perf_counter() - t0)
        print(f"one at a time: {name} {naive_s[-1]:.1f} s", file=sys.stderr, flush=True)
    done = len(want)
    rel = float(np.max(np.abs(got[:done] - want) / np.abs(want))) if done else None
    print(
        json.dumps(
            {
                "strategies": [n for n, _ in named],
                "threads": torch.get_num_threads(),
                "uptime_before": before,
                "uptime_after": uptime(),
                "batched": {
                    "wall_s": round(batched_s, 1),
                    "forward_calls": batched.forward_calls,
                    "kl": [float(x) for x in got],
                },
                "one_at_a_time": {
                    "measured": done,
                    "fullkv_reference_s": round(reference_s, 1),
                    "wall_s_each": [round(x, 1) for x in naive_s],
                    "wall_s": round(reference_s + sum(naive_s), 1),
                    "forward_calls": naive.forward_calls,
                    "kl": want,
                },
                "max_relative_difference": rel,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
