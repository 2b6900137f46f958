"""Do single-layer cells predict eviction in every layer at once? The additivity check of a signal table.

Every solver assumes that a strategy's degradation is the sum of its cells, each measured with one
layer evicting and the rest FullKV. This script rebuilds a table's own calibration samples (same
corpus, seed, lengths and retrieval mix; checked by fingerprint), runs each uniform pattern at each
budget with *every* layer evicting in both phases, and sets the measured per-token KL(FullKV ‖ entry)
on each sample's scored tokens beside the table's prediction (the sum of that pattern's single-layer
cells over layers and phases, on the same samples). Evidence samples (a retrieval-aware table) and
prose samples are reported apart, with the evidence answers still predicted right.

Run (from the repository root; 79 s on 2 cores for the command below)::

    python benchmarks/diagnose_additivity.py --signals runs/study6-ruler/signals-retrieval.json \
        --budgets 64,128,256 --answerable 16 1024 256 --json runs/study6-ruler/additivity.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polykv_search.data import load_corpus, samples_fingerprint  # noqa: E402
from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix, scored_span  # noqa: E402
from polykv_search.evaluation.fidelity import log_probs, token_kl  # noqa: E402
from polykv_search.io import atomic_write_text, read_text  # noqa: E402
from polykv_search.runtime import apply_strategy, strategy_plans  # noqa: E402
from polykv_search.scoring.job import SampleJob  # noqa: E402
from polykv_search.scoring.shared import SharedScorer  # noqa: E402
from strategies import Strategy  # noqa: E402


def calibration_samples(table: dict, tokenizer) -> list:
    """The table's own calibration samples, rebuilt from its provenance (refused if they differ)."""
    cal = table["provenance"]["calibration"]
    retrieval = table["provenance"].get("retrieval") or {}
    mix = parse_retrieval_mix(retrieval.get("mix"), records=retrieval.get("records_per_sample") or 4)
    samples = make_calibration_samples(
        tokenizer,
        load_corpus(cal["spec"]),
        n_samples=cal["n_samples"],
        context_len=cal["context_len"],
        continuation_len=cal["continuation_len"],
        seed=cal["seed"],
        mix=mix,
    )
    if samples_fingerprint(samples) != cal["fingerprint"]:
        raise SystemExit("error: the rebuilt calibration samples differ from the table's (fingerprint)")
    return samples


def predicted(table: dict, pattern: str, budget: int) -> np.ndarray:
    """Per sample: the sum over layers and phases of the single-layer KL cells of ``pattern`` at ``budget``."""
    cells = np.asarray(table["uncertainty"]["per_sample"]["kl"])  # [layer, phase, pattern, budget, sample]
    return cells[:, :, table["patterns"].index(pattern), table["budgets"].index(budget), :].sum(axis=(0, 1))


def measured(model, samples: list, strategies: list[Strategy]) -> tuple[np.ndarray, np.ndarray]:
    """Per strategy and sample: mean per-token KL(FullKV ‖ strategy) on the sample's scored tokens;
    and per sample, for FullKV (row 0) then each strategy, whether every scored token is the greedy
    prediction (teacher-forced, all layers evicting)."""
    L = strategies[0].num_layers
    entries = [Strategy.full(L), *strategies]
    kl = np.zeros((len(strategies), len(samples)))
    right = np.zeros((len(entries), len(samples)), dtype=bool)
    with apply_strategy(model, Strategy.full(L)) as runtime:
        scorer = SharedScorer(model, runtime, [strategy_plans(s) for s in entries])
        for j, s in enumerate(samples):
            job = SampleJob("teacher_forced", list(s.context_ids), [], target_ids=list(s.continuation_ids))
            outcomes = scorer.run(job, fidelity=True)
            a, b = scored_span(s)
            ref = log_probs(outcomes[0].logits)[a:b]
            target = np.asarray(s.continuation_ids[a:b])
            for i, out in enumerate(outcomes):
                right[i, j] = bool((out.logits[a:b].argmax(-1).numpy() == target).all())
                if i:
                    kl[i - 1, j] = float(token_kl(ref, log_probs(out.logits)[a:b]).mean())
    return kl, right


def answerable_check(
    model, tok, table: dict, n: int, context_len: int, budget: int, records: int | None = None
) -> dict:
    """``n`` fresh evidence samples (every one carries evidence; the table's corpus, seed, records and
    continuation length, at ``context_len``): per uniform pattern at ``budget``, every layer
    evicting, how many of the answers FullKV gets right it still gets right, and its answer-token KL."""
    cal = table["provenance"]["calibration"]
    records = records or (table["provenance"].get("retrieval") or {}).get("records_per_sample") or 4
    fresh = make_calibration_samples(
        tok,
        load_corpus(cal["spec"]),
        n_samples=n,
        context_len=context_len,
        continuation_len=cal["continuation_len"],
        seed=cal["seed"],
        mix=parse_retrieval_mix(str(n), records=records),
    )
    patterns = table["patterns"]
    kl, right = measured(model, fresh, [Strategy.uniform(table["num_layers"], q, budget) for q in patterns])
    ok = right[0]
    print(f"\n{n} fresh evidence samples ({records} records each) at {context_len} tokens, B = {budget}:")
    print(f"FullKV answers {ok.sum()} right")
    out = {"samples": n, "records": records, "context_len": context_len, "budget": budget, "full_right": int(ok.sum())}
    out["patterns"] = {}
    for i, q in enumerate(patterns):
        row = {"right": int(right[i + 1][ok].sum()), "kl_answerable": float(kl[i][ok].mean()) if ok.any() else None}
        out["patterns"][q] = row
        print(f"  {q:<14} {row['right']:>3}/{ok.sum()} still right, answer KL {row['kl_answerable'] or 0:.3f}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--signals", required=True, help="a signal table (version 2, with per-sample values)")
    p.add_argument("--budgets", help="budgets of the table's grid to check (default: all)")
    p.add_argument("--model", help="default: the table's model")
    p.add_argument("--json", help="also write the figures as JSON")
    p.add_argument(
        "--answerable",
        nargs=3,
        type=int,
        metavar=("N", "CONTEXT", "B"),
        help="also run N fresh evidence samples at CONTEXT tokens with each uniform pattern at B (every layer): "
        "of the answers FullKV gets right, how many each keeps",
    )
    p.add_argument("--records", type=int, help="--answerable: evidence statements per sample (default: the table's)")
    args = p.parse_args(argv)
    table = json.loads(read_text(args.signals))
    if "per_sample" not in (table.get("uncertainty") or {}):
        p.error(f"{args.signals}: no per-sample values (collect it with this version)")
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else table["budgets"]
    bad = [b for b in budgets if b not in table["budgets"]]
    if bad:
        p.error(f"--budgets: {bad[0]} is not in the table's grid {table['budgets']}")
    from polykv_search.models import load_model

    model, tok = load_model(args.model or table["provenance"]["model"])
    samples = calibration_samples(table, tok)
    evidence = np.array([getattr(s, "scored", None) is not None for s in samples])
    cells = [(q, b) for b in budgets for q in table["patterns"]]
    L = table["num_layers"]
    kl, right = measured(model, samples, [Strategy.uniform(L, q, b) for q, b in cells])
    rows = []
    for i, (q, b) in enumerate(cells):
        pred = predicted(table, q, b)
        row = {"pattern": q, "budget": b}
        for name, sel in (("evidence", evidence), ("prose", ~evidence)):
            if sel.any():
                row[name] = {"predicted_kl": float(pred[sel].mean()), "measured_kl": float(kl[i, sel].mean())}
        if evidence.any():
            row["evidence"]["answers_right"] = int(right[i + 1, evidence].sum())
        rows.append(row)
    print(f"{args.signals}: {evidence.sum()} evidence + {(~evidence).sum()} prose samples, every layer evicting;")
    print(f"FullKV predicts {right[0, evidence].sum()} of the {evidence.sum()} evidence answers right")
    head = ("B", "pattern", "evid. pred", "measured", "right", "prose pred", "measured")
    print("{:>4} {:<14} {:>10} {:>9} {:>6} {:>10} {:>9}".format(*head))
    for r in rows:
        e, pr = r.get("evidence", {}), r.get("prose", {})
        cols = [
            f"{e['predicted_kl']:10.3f} {e['measured_kl']:9.3f} {e['answers_right']:>3}/{evidence.sum()}"
            if e
            else " " * 27,
            f"{pr['predicted_kl']:10.3f} {pr['measured_kl']:9.3f}" if pr else "",
        ]
        print(f"{r['budget']:>4} {r['pattern']:<14} {' '.join(cols)}")
    ranks = {}
    for name in ("evidence", "prose"):
        pts = [(r[name]["predicted_kl"], r[name]["measured_kl"]) for r in rows if name in r]
        if len(pts) > 2:
            ranks[name] = float(stats.spearmanr(*zip(*pts)).statistic)
            print(f"Spearman(predicted, measured) over the {len(pts)} cells, {name}: {ranks[name]:+.2f}")
    doc = {
        "signals": args.signals,
        "evidence_samples": int(evidence.sum()),
        "rows": rows,
        "spearman": ranks,
        "full_answers_right": int(right[0, evidence].sum()),
    }
    if args.answerable:
        doc["answerable"] = answerable_check(model, tok, table, *args.answerable, records=args.records)
    if args.json:
        atomic_write_text(args.json, json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
