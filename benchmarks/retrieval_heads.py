"""Which KV heads retrieve? Retrieval scores (Wu et al., arXiv 2404.15574) per layer and KV head.

    python benchmarks/retrieval_heads.py --samples 24 --context-len 1024 --json runs/retrieval_heads.json \
        --plot runs/retrieval_heads.png

Evidence samples of the calibration split (``--calib``, default the Austen corpus; every sample carries
``--records`` statements, one of them queried and its answer teacher-forced in the continuation), the
model under FullKV with its eager kernel, and per (layer, KV head) the share of answer tokens whose
predicting query attends most to the token being copied (:mod:`signals.retrieval_heads`), with its
standard error over samples. Prints the table (layers × KV heads), the top heads, and how concentrated
retrieval is; writes the JSON and a heatmap. The head-level strategies of a later release keep the
highest-scoring heads whole; this script is the measurement they start from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402

from polykv_search.data import DEFAULT_CORPUS, load_corpus  # noqa: E402
from polykv_search.data.errors import DataError  # noqa: E402
from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix  # noqa: E402
from polykv_search.io import write_json  # noqa: E402
from polykv_search.models import DEFAULT_MODEL, load_model  # noqa: E402
from polykv_search.progress import ProgressBar  # noqa: E402
from signals.retrieval_heads import retrieval_scores  # noqa: E402


def table_lines(scores) -> list[str]:
    """One row per layer: each KV head's mean ± SE (an 80-column table for up to 4 KV heads)."""
    heads = scores.mean.shape[1]
    lines = ["layer " + "".join(f"   kv{h:<2d} mean±se" for h in range(heads))]
    for l in range(scores.mean.shape[0]):
        cells = "".join(f"   {scores.mean[l, h]:5.2f} ± {scores.se[l, h]:4.2f}" for h in range(heads))
        lines.append(f"{l:5d} {cells}")
    return lines


def plot(scores, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2 + scores.mean.shape[1], 0.25 * scores.mean.shape[0] + 1.5))
    im = ax.imshow(scores.mean, aspect="auto", cmap="viridis", vmin=0, vmax=max(float(scores.mean.max()), 1e-9))
    ax.set_xlabel("KV head")
    ax.set_ylabel("layer")
    ax.set_title(f"retrieval score ({scores.n_samples} samples)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--device", default="cpu")
    p.add_argument("--calib", default=DEFAULT_CORPUS, help="calibration corpus (its calibration split is used)")
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--context-len", type=int, default=1024)
    p.add_argument("--continuation-len", type=int, default=32)
    p.add_argument("--records", type=int, default=1, help="evidence statements per sample (default 1: one needle)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--json", help="write the scores here")
    p.add_argument("--plot", help="write a heatmap PNG here")
    args = p.parse_args(argv)
    if args.samples < 2:
        print("error: --samples must be at least 2 (standard errors need two)", file=sys.stderr)
        return 2
    try:
        mix = parse_retrieval_mix(str(args.samples), records=args.records)
        mix.evidence_samples(args.samples, args.context_len)
        corpus = load_corpus(args.calib)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model, tok = load_model(args.model, device=args.device)
    try:
        samples = make_calibration_samples(
            tok,
            corpus,
            n_samples=args.samples,
            context_len=args.context_len,
            continuation_len=args.continuation_len,
            seed=args.seed,
            mix=mix,
        )
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with ProgressBar(Console(stderr=True), "retrieval scores", len(samples), unit="samples") as bar:
        scores = retrieval_scores(model, samples, on_sample=bar.advance)
    print("\n".join(table_lines(scores)))
    top = scores.top(args.top)
    print(f"\ntop {len(top)} KV heads (layer, head: mean ± se):")
    for l, h, s in top:
        print(f"  L{l:<3d} kv{h}: {s:.2f} ± {scores.se[l, h]:.2f}")
    flat = sorted(scores.mean.ravel(), reverse=True)
    total = sum(flat) or 1.0
    share = float(sum(flat[: max(1, len(flat) // 20)]) / total)
    print(f"the top 5 % of KV heads hold {100 * share:.0f} % of the total retrieval score")
    if args.json:
        write_json(
            args.json,
            {
                "model": args.model,
                "calib": args.calib,
                "samples": scores.n_samples,
                "context_len": args.context_len,
                "continuation_len": args.continuation_len,
                "records": args.records,
                "seed": args.seed,
                "mean": scores.mean.tolist(),
                "se": scores.se.tolist(),
                "top": top,
                "top5pct_share": share,
            },
        )
    if args.plot:
        plot(scores, args.plot)
    return 0


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
