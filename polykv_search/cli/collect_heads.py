"""`collect`'s per-KV-head signals: ``--retrieval-heads N`` and ``--head-cells [BUDGETS]``.

``--retrieval-heads N`` measures each KV head's retrieval score (:mod:`signals.retrieval_heads`) on N
calibration-split evidence samples (one statement each by default). ``--head-cells 32,64,128`` adds the
streaming cells (:mod:`signals.head_cells`): per (layer, KV head, budget), KL(FullKV || only that KV head
keeps 4 sinks + recent tokens) on the answer tokens of the same evidence samples and on every continuation
token of the collection's prose samples. Both go into the table's ``heads`` block (written as version 4
when it has cells); ``--head-cells`` without ``--retrieval-heads`` uses :data:`DEFAULT_HEAD_SAMPLES`
evidence samples and stores their retrieval scores too.
"""

from __future__ import annotations

import argparse

from polykv_search.cli.common import CLIError, comma_list, console, non_negative_int, positive_int

DEFAULT_HEAD_SAMPLES = 8
DEFAULT_CELL_BUDGETS = "32,64,128"
CELL_SINK = 4


def add_args(g) -> None:
    """The per-head options, in the calibration-data group."""
    g.add_argument(
        "--retrieval-heads",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="also measure each KV head's retrieval score (Wu et al.) on N >= 2 calibration-split evidence samples "
        "(one statement each, its answer teacher-forced) and store it in the table (default 0: not measured)",
    )
    g.add_argument(
        "--head-cells",
        type=comma_list(positive_int, "budget"),
        nargs="?",
        const=DEFAULT_CELL_BUDGETS,
        default=None,
        metavar="BUDGETS",
        help=f"also measure the streaming cells per (layer, KV head): KL(FullKV || only that KV head keeps "
        f"{CELL_SINK} sinks + recent tokens) at these budgets (default {DEFAULT_CELL_BUDGETS}), on the answers of "
        f"the --retrieval-heads evidence samples ({DEFAULT_HEAD_SAMPLES} if not given) and on the prose samples",
    )


def head_samples(args: argparse.Namespace) -> int:
    """Evidence samples of the per-head signals (0: none measured)."""
    if args.retrieval_heads:
        return args.retrieval_heads
    return DEFAULT_HEAD_SAMPLES if getattr(args, "head_cells", None) else 0


def check(args: argparse.Namespace, mix) -> None:
    """The per-head options' checks that need no model (one-line :class:`CLIError`)."""
    from polykv_search.data import DataError
    from polykv_search.data.evidence import parse_retrieval_mix

    heads = args.retrieval_heads
    cells = getattr(args, "head_cells", None)
    if heads and heads < 2:
        raise CLIError(f"--retrieval-heads {heads}: give at least 2 samples (a standard error needs two)")
    if cells:
        low = [b for b in cells if b <= CELL_SINK]
        if low:
            raise CLIError(f"--head-cells: budgets must exceed the {CELL_SINK} sinks, got {low}")
        if max(cells) >= args.context_len:
            raise CLIError(f"--head-cells: budgets must be below --context-len {args.context_len}, got {max(cells)}")
        evidence = mix.evidence_samples(args.samples, args.context_len) if mix is not None else 0
        if evidence >= args.samples:
            raise CLIError("--head-cells needs prose samples for its prose KL; --retrieval-mix leaves none")
    n = head_samples(args)
    if n:
        try:
            parse_retrieval_mix(str(n), records=args.evidence_records or 1).evidence_samples(n, args.context_len)
        except DataError as err:
            message = str(err).replace("evidence records per sample:", "--evidence-records", 1)
            raise CLIError(message.replace("context_len ", "--context-len ", 1)) from None


def measure(args: argparse.Namespace, table, model, tokenizer, corpus, out, samples) -> None:
    """Retrieval scores (and with ``--head-cells`` the streaming cells) per KV head, stored in the table at
    ``out``; ``samples``: the collection's calibration samples (its prose ones give the prose KL)."""
    from polykv_search.data.evidence import EvidenceSample, make_calibration_samples, parse_retrieval_mix
    from polykv_search.progress import ProgressBar
    from signals.head_cells import measure_head_cells
    from signals.head_signals import DEFINITION, HeadSignals
    from signals.retrieval_heads import retrieval_scores

    n, records = head_samples(args), args.evidence_records or 1
    budgets = getattr(args, "head_cells", None)
    provenance = {
        "samples": n,
        "records": records,
        "context_len": args.context_len,
        "continuation_len": args.continuation_len,
        "seed": args.seed,
        "split": "calib",
        "definition": DEFINITION,
    }
    prose = [s for s in samples if not isinstance(s, EvidenceSample)]
    cells_key = {
        "evidence": provenance,
        "prose_samples": len(prose),
        "calibration": table.provenance.get("calibration"),
    }
    done = table.heads is not None and table.heads.provenance == provenance
    if done and (not budgets or _same_cells(table.heads.cells, budgets, cells_key)):
        return  # measured already, with these settings
    evidence = make_calibration_samples(
        tokenizer,
        corpus,
        n_samples=n,
        context_len=args.context_len,
        continuation_len=args.continuation_len,
        seed=args.seed,
        mix=parse_retrieval_mix(str(n), records=records),
    )
    bar_console = None if args.no_progress else console
    if done:
        scores = table.heads.retrieval
    else:
        with ProgressBar(bar_console, "retrieval heads", n, unit="samples") as bar:
            scores = retrieval_scores(model, evidence, on_sample=bar.advance)
    cells = None
    if budgets:
        with ProgressBar(bar_console, "streaming cells", n + len(prose), unit="samples") as bar:
            cells = measure_head_cells(
                model, evidence, prose, budgets=budgets, sink=CELL_SINK, on_sample=bar.advance, provenance=cells_key
            )
    table.set_heads(HeadSignals(scores, provenance, cells))
    table.save(out)
    (layer, head, score), *_ = scores.top(1)
    console.print(
        f"retrieval heads: {n} evidence samples; strongest KV head L{layer} kv{head} ({score:.2f})", highlight=False
    )
    if cells is not None:
        (layer, head, kl, _), *_ = cells.costliest(1, cells.budgets[0])
        console.print(
            f"streaming cells: budgets {','.join(map(str, cells.budgets))} on {n} evidence + {len(prose)} prose "
            f"samples in {cells.provenance['seconds']:.1f}s; costliest at b={cells.budgets[0]}: L{layer} kv{head} "
            f"(answer KL {kl:.3f})",
            highlight=False,
        )


def _same_cells(cells, budgets, key) -> bool:
    if cells is None or list(cells.budgets) != sorted(budgets) or cells.sink != CELL_SINK:
        return False
    return all(cells.provenance.get(k) == v for k, v in key.items())
