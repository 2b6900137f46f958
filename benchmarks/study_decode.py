"""The decode study's paired table (issue 27), from one `score --suite decode` results file.

Run (from the repository root)::

    python benchmarks/study_decode.py RESULTS.json --out studies/decode/study_decode_pairs.json > table.md

Entries are found by name: ``full``, and per budget B ``uniform-P-B``, ``ilp-B``, ``decoding-only-B``
and ``prefill-only-B`` (the file stems of the study's strategies). Per budget it prints every entry's
mean with its 95 % bootstrap interval and the paired differences the plan names: decoding-only and
prefill-only against uniform-snapkv (the same plan in the other phase), ilp and decoding-only against
the best uniform (lowest KL for KL, highest score for scores), plus gap recovered on KL,
(KL_u - KL_e) / KL_u, and on top-1 agreement, (S_e - S_u) / (S_full - S_u). Measures:
``kl`` = mean per-token KL(FullKV ‖ entry) on decode/trajectory, ``agree`` = its top-1 agreement %,
``recall`` = decode/recall exact match %. "not resolved" where an interval contains 0.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from polykv_search import stats
from polykv_search.io import read_text, write_json

MEASURES = {  # name -> (task, per-sample field, lower is better)
    "kl": ("decode/trajectory", "kl", True),
    "agree": ("decode/trajectory", "score", False),
    "recall": ("decode/recall", "score", False),
}


def per_sample(entry: dict, task: str, field: str) -> np.ndarray:
    records = sorted(entry["tasks"][task]["per_sample"], key=lambda r: str(r["id"]))
    return np.asarray([float(r[field]) for r in records])


def fmt(iv: stats.Interval, digits: int) -> str:
    mark = "" if iv.excludes_zero else " (not resolved)"
    return f"{iv.estimate:+.{digits}f} [{iv.low:+.{digits}f}, {iv.high:+.{digits}f}]{mark}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("--out", help="write the pairs as JSON")
    p.add_argument("--budgets", default="64,128")
    args = p.parse_args(argv)
    doc = json.loads(read_text(args.results))  # .json or the studies' .json.xz
    by_name = {e["name"]: e for e in doc["entries"]}
    options = {"seed": 0}
    out: dict = {"results": args.results, "samples": doc["provenance"]["settings"]["samples"], "budgets": {}}
    lines = []
    for budget in [int(b) for b in args.budgets.split(",")]:
        uniforms = [n for n in by_name if n.startswith("uniform-") and n.endswith(f"-{budget}")]
        names = ["full", *uniforms] + [f"{k}-{budget}" for k in ("ilp", "decoding-only", "prefill-only")]
        names = [n for n in names if n in by_name]
        values = {n: {m: per_sample(by_name[n], t, f) for m, (t, f, _) in MEASURES.items()} for n in names}
        res: dict = {"means": {}, "pairs": {}, "gaps": {}}
        lines += [f"\n### B = {budget}\n", "| entry | KL (nats/token) | top-1 agreement % | recall EM % |"]
        lines.append("|---|---:|---:|---:|")
        for n in names:
            ivs = {m: stats.mean_interval(values[n][m], **options) for m in MEASURES}
            res["means"][n] = {m: iv.to_json() for m, iv in ivs.items()}
            cells = [
                f"{ivs[m].estimate:.4f} [{ivs[m].low:.4f}, {ivs[m].high:.4f}]"
                if m == "kl"
                else f"{ivs[m].estimate:.1f} [{ivs[m].low:.1f}, {ivs[m].high:.1f}]"
                for m in MEASURES
            ]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        best = {
            m: (min if low else max)(uniforms, key=lambda n, m=m: float(values[n][m].mean()))
            for m, (_, _, low) in MEASURES.items()
        }
        res["best_uniform"] = best
        same = f"uniform-snapkv-{budget}"
        pairs = [(f"decoding-only-{budget}", same), (f"prefill-only-{budget}", same)]
        pairs += [(f"{k}-{budget}", "best") for k in ("ilp", "decoding-only", "prefill-only")]
        lines += ["", "| paired difference | Δ KL | Δ agreement (pts) | Δ recall (pts) |", "|---|---:|---:|---:|"]
        for a, b in pairs:
            if a not in values:
                continue
            cells = []
            for m in MEASURES:
                ref = best[m] if b == "best" else b
                iv = stats.paired_difference_interval([values[a][m]], [values[ref][m]], **options)
                res["pairs"][f"{a} - {ref}: {m}"] = iv.to_json()
                cells.append(fmt(iv, 4 if m == "kl" else 1))
            label = f"{a} − {'best uniform' if b == 'best' else b}"
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", "| gap recovered | on KL | on top-1 agreement |", "|---|---:|---:|"]
        for k in ("ilp", "decoding-only", "prefill-only"):
            n = f"{k}-{budget}"
            if n not in values:
                continue
            kl_gap = stats.kl_gap_interval([values[n]["kl"]], [values[best["kl"]]["kl"]], **options)
            agree_gap = stats.gap_recovered_interval(
                [values[n]["agree"]], [values[best["agree"]]["agree"]], [values["full"]["agree"]], **options
            )
            res["gaps"][n] = {"kl": kl_gap.to_json(), "agree": agree_gap.to_json()}
            lines.append(f"| {n} | {_gap(kl_gap)} | {_gap(agree_gap)} |")
        out["budgets"][str(budget)] = res
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out:
        write_json(args.out, out)
    return 0


def _gap(g: stats.Gap) -> str:
    if g.interval is None:
        return f"n/a ({g.reason})"
    iv = g.interval
    mark = "" if iv.excludes_zero else " (not resolved)"
    return f"{100 * iv.estimate:.0f}% [{100 * iv.low:.0f}, {100 * iv.high:.0f}]{mark}"


if __name__ == "__main__":
    raise SystemExit(main())
