"""Do the retrieval heads cost the most when streamed? Streaming cells per KV head beside retrieval scores.

    python benchmarks/head_cells.py --samples 8 --prose-samples 8 --context-len 512 --budgets 32,64,128 \
        --json studies/heads/head_cells_smollm2.json

On ``--samples`` calibration-split evidence samples (one statement each, the answer teacher-forced) the
script measures every KV head's retrieval score (:mod:`signals.retrieval_heads`) and, per (layer, KV head,
budget), the streaming cell (:mod:`signals.head_cells`): KL(FullKV || only that KV head keeps 4 sinks + the
recent ``b - 4`` tokens) on the answer tokens; the same cells' KL on ``--prose-samples`` prose samples.
Reports the time of each part, the costliest cells, and the Spearman rank correlation between the
retrieval score and the answer KL (and the prose KL) over the ``L x H`` KV heads, per budget, with a
95 % interval from a paired bootstrap over evidence samples (both measurements resampled together) and
Fisher's z interval that takes the heads as the units.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from scipy import stats  # noqa: E402

from polykv_search.data import DEFAULT_CORPUS, load_corpus  # noqa: E402
from polykv_search.data.errors import DataError  # noqa: E402
from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix  # noqa: E402
from polykv_search.io import write_json  # noqa: E402
from polykv_search.models import DEFAULT_MODEL, load_model  # noqa: E402
from polykv_search.progress import ProgressBar  # noqa: E402
from signals.head_cells import DEFAULT_SINK, cells_per_sample, check_cell_budgets  # noqa: E402
from signals.retrieval_heads import retrieval_scores  # noqa: E402


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(stats.spearmanr(x.ravel(), y.ravel()).statistic)


def correlation(retrieval: np.ndarray, kl: np.ndarray, seed: int, paired: bool, resamples: int = 2000) -> dict:
    """Spearman's rho of the per-head means of ``retrieval`` ``[S, L, H]`` and ``kl`` ``[S', L, H]``, a
    bootstrap interval over samples (``paired``: the same samples, resampled together; else each set on its
    own) and Fisher's z interval that takes the heads as the units."""
    rho = spearman(retrieval.mean(0), kl.mean(0))
    rng = np.random.default_rng(seed)
    s, s2 = retrieval.shape[0], kl.shape[0]
    boot = []
    for _ in range(resamples):
        idx = rng.integers(0, s, s)
        idx2 = idx if paired else rng.integers(0, s2, s2)
        boot.append(spearman(retrieval[idx].mean(0), kl[idx2].mean(0)))
    boot = np.array(boot)
    boot = boot[np.isfinite(boot)]
    n = retrieval[0].size
    z, half = np.arctanh(rho), 1.96 * np.sqrt(1.06 / (n - 3))  # Fieller et al.'s variance for Spearman
    return {
        "rho": rho,
        "bootstrap_95": [float(np.percentile(boot, q)) if boot.size else float("nan") for q in (2.5, 97.5)],
        "fisher_95": [float(np.tanh(z - half)), float(np.tanh(z + half))],
        "heads": n,
    }


def finite(node):
    """``node`` with every NaN as None (JSON has no NaN)."""
    if isinstance(node, dict):
        return {k: finite(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [finite(v) for v in node]
    return None if isinstance(node, float) and not np.isfinite(node) else node


def ranks(values: np.ndarray) -> np.ndarray:
    """Rank of every head (1 = highest value)."""
    order = np.argsort(-values.ravel(), kind="stable")
    out = np.empty(values.size, dtype=int)
    out[order] = np.arange(1, values.size + 1)
    return out.reshape(values.shape)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--device", default="cpu")
    p.add_argument("--calib", default=DEFAULT_CORPUS, help="calibration corpus (its calibration split is used)")
    p.add_argument("--samples", type=int, default=8, help="evidence samples (default 8)")
    p.add_argument("--prose-samples", type=int, default=8, help="prose samples (default 8)")
    p.add_argument("--context-len", type=int, default=512)
    p.add_argument("--continuation-len", type=int, default=32)
    p.add_argument("--budgets", default="32,64,128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=8)
    p.add_argument(
        "--compare-collect",
        type=int,
        default=0,
        metavar="K",
        help="also time collect's default grid on the first K prose samples (the cost the cells add to)",
    )
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    try:
        budgets = check_cell_budgets([int(b) for b in args.budgets.split(",")], DEFAULT_SINK)
        if args.samples < 2 or args.prose_samples < 1:
            raise ValueError("--samples must be at least 2 and --prose-samples at least 1")
        mix = parse_retrieval_mix(str(args.samples), records=1)
        mix.evidence_samples(args.samples, args.context_len)
        corpus = load_corpus(args.calib)
    except (DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model, tok = load_model(args.model, device=args.device)
    common = dict(context_len=args.context_len, continuation_len=args.continuation_len, seed=args.seed)
    evidence = make_calibration_samples(tok, corpus, n_samples=args.samples, mix=mix, **common)
    # prose windows after the evidence ones (same seed: the first windows are the evidence samples' prose)
    prose = make_calibration_samples(tok, corpus, n_samples=args.samples + args.prose_samples, **common)
    prose = prose[args.samples :]
    console = Console(stderr=True)
    t0 = time.perf_counter()
    scores = retrieval_scores(model, evidence)
    t_retrieval = time.perf_counter() - t0
    with ProgressBar(console, "streaming cells", len(evidence) + len(prose), unit="samples") as bar:
        t0 = time.perf_counter()
        answer = cells_per_sample(model, evidence, budgets, DEFAULT_SINK, on_sample=bar.advance)
        t_answer = time.perf_counter() - t0
        t0 = time.perf_counter()
        prose_kl = cells_per_sample(model, prose, budgets, DEFAULT_SINK, on_sample=bar.advance)
        t_prose = time.perf_counter() - t0
    if args.compare_collect:
        from signals.collect import collect_signals

        t0 = time.perf_counter()
        collect_signals(model, prose[: args.compare_collect], journal=False)
        per_collect = (time.perf_counter() - t0) / args.compare_collect
        per_cells = t_prose / len(prose)
        print(f"default collect grid: {per_collect:.1f}s per prose sample; prose cells {per_cells:.1f}s per sample")
    L, H = scores.mean.shape
    print(f"{L} layers x {H} KV heads x {len(budgets)} budgets; {len(evidence)} evidence + {len(prose)} prose samples")
    print(f"time: retrieval scores {t_retrieval:.1f}s, answer cells {t_answer:.1f}s, prose cells {t_prose:.1f}s")
    result = {
        "model": args.model,
        "calib": args.calib,
        "samples": len(evidence),
        "prose_samples": len(prose),
        "context_len": args.context_len,
        "continuation_len": args.continuation_len,
        "seed": args.seed,
        "sink": DEFAULT_SINK,
        "budgets": list(budgets),
        "seconds": {"retrieval": t_retrieval, "answer_cells": t_answer, "prose_cells": t_prose},
        "collect_seconds_per_prose_sample": per_collect if args.compare_collect else None,
        "retrieval_mean": scores.mean.tolist(),
        "kl_answer_mean": answer.mean(0).tolist(),
        "kl_answer_se": stats.sem(answer, axis=0).tolist(),
        "kl_prose_mean": prose_kl.mean(0).tolist(),
        "kl_prose_se": stats.sem(prose_kl, axis=0).tolist(),
        "per_budget": [],
    }
    top_retrieval = scores.top(5)
    print("top retrieval heads: " + ", ".join(f"L{l} kv{h} {s:.2f}" for l, h, s in top_retrieval))
    for g, b in enumerate(budgets):
        a_mean, a_se = answer[..., g].mean(0), stats.sem(answer[..., g], axis=0)
        rk = ranks(a_mean)
        row = {
            "budget": b,
            "answer": correlation(scores.per_sample, answer[..., g], args.seed, paired=True),
            "prose": correlation(scores.per_sample, prose_kl[..., g], args.seed, paired=False),
            "answer_rank_of_top_retrieval": [[l, h, int(rk[l, h])] for l, h, _ in top_retrieval],
        }
        flat = sorted(np.ndindex(L, H), key=lambda lh: -a_mean[lh])[: args.top]
        row["costliest"] = [[l, h, float(a_mean[l, h]), float(a_se[l, h])] for l, h in flat]
        result["per_budget"].append(row)
        c, pr = row["answer"], row["prose"]
        print(
            f"\nb={b}: costliest answer KL (mean ± se): "
            + ", ".join(f"L{l} kv{h} {m:.3f}±{s:.3f}" for l, h, m, s in row["costliest"])
        )
        print(
            "  answer-KL rank of the top retrieval heads: "
            + ", ".join(f"L{l} kv{h} #{r}" for l, h, r in row["answer_rank_of_top_retrieval"])
        )
        print(
            f"  Spearman(retrieval, answer KL) = {c['rho']:.2f}, bootstrap 95 % [{c['bootstrap_95'][0]:.2f}, "
            f"{c['bootstrap_95'][1]:.2f}], Fisher z [{c['fisher_95'][0]:.2f}, {c['fisher_95'][1]:.2f}]; "
            f"(retrieval, prose KL) = {pr['rho']:.2f} [{pr['bootstrap_95'][0]:.2f}, {pr['bootstrap_95'][1]:.2f}]"
        )
    if args.json:
        write_json(args.json, finite(result))
    return 0


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
