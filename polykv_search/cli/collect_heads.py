"""`collect`'s per-KV-head signals: ``--retrieval-heads N`` and ``--head-cells [BUDGETS]``.

``--retrieval-heads N`` measures each KV head's retrieval score (:mod:`signals.retrieval_heads`) on N
calibration-split evidence samples (one statement each by default). ``--head-cells 32,64,128`` adds the
streaming cells (:mod:`signals.head_cells`): per (layer, KV head, budget), KL(FullKV || only that KV head
keeps 4 sinks + recent tokens) on the answer tokens of the same evidence samples and on every continuation
token of the collection's prose samples. ``--head-patterns streaming_llm,snapkv,h2o`` (default
``streaming_llm``) chooses the patterns of the cells: ``streaming_llm`` gives the streaming cells, a scored
pattern its prefill cells (:mod:`signals.head_prefill_cells`: only that KV head compresses its prompt with the
pattern at the budget, and keeps every continuation token), on the same samples and budgets; a spec with
parameters (``kvzip[allocation=model]``) is measured with them (a pooled pattern: the head as its own pool).
All go into the table's ``heads`` block (written as version 4 when it has streaming cells, 5 with
prefill cells); ``--head-cells`` without ``--retrieval-heads`` uses :data:`DEFAULT_HEAD_SAMPLES` evidence
samples and stores their retrieval scores too. A rerun measures only what the table lacks.
"""

from __future__ import annotations

import argparse

from polykv_search.cli.arg_types import at_most, comma_list, pattern_specs, positive_int
from polykv_search.cli.common import CLIError, console
from polykv_search.cli.score_checks import MAX_SAMPLES
from polykv_search.patterns.spec import parse_spec, split_specs

DEFAULT_HEAD_SAMPLES = 8
DEFAULT_CELL_BUDGETS = "32,64,128"
CELL_SINK = 4
STREAMING = "streaming_llm"


def add_args(g) -> None:
    """The per-head options, in the calibration-data group."""
    g.add_argument(
        "--retrieval-heads",
        type=at_most(MAX_SAMPLES, "samples", zero=True),
        default=0,
        metavar="N",
        help="also measure each KV head's retrieval score (Wu et al.) on N >= 2 calibration-split evidence samples "
        "(one statement each, its answer teacher-forced) and store it in the table (default 0: not measured; at "
        f"most {MAX_SAMPLES:,})",
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
    g.add_argument(
        "--head-patterns",
        type=pattern_specs(),
        default=STREAMING,
        metavar="PATTERNS",
        help="with --head-cells: the patterns of the cells, comma separated (default streaming_llm): streaming_llm "
        "gives the streaming cells; snapkv, pyramidkv, h2o, knorm, keydiff, expected_attention or kvzip the prefill "
        "cells, KL(FullKV || only that KV head compresses its prompt with the pattern at the budget), with "
        "parameters as kvzip[allocation=model] (a pooled pattern: the head measured as a pool of its own; the solve "
        "pools the heads it gives it); solve --granularity head chooses among them per KV head",
    )


def head_samples(args: argparse.Namespace) -> int:
    """Evidence samples of the per-head signals (0: none measured)."""
    if args.retrieval_heads:
        return args.retrieval_heads
    return DEFAULT_HEAD_SAMPLES if getattr(args, "head_cells", None) else 0


def head_patterns(args: argparse.Namespace) -> list[str]:
    """The patterns of the head cells (``--head-patterns``, specs as given; streaming_llm alone when absent)."""
    patterns = getattr(args, "head_patterns", None) or STREAMING
    return split_specs(patterns) if isinstance(patterns, str) else list(patterns)


#: Evidence samples the retrieval scores need at least (their standard error needs two).
MIN_RETRIEVAL_SAMPLES = 2


def check(args: argparse.Namespace, mix) -> None:
    """The per-head options' checks that need no model (one-line :class:`CLIError`)."""
    from polykv_search.data import DataError
    from polykv_search.data.evidence import parse_retrieval_mix
    from polykv_search.patterns import canonical_spec
    from signals.head_prefill_cells import PREFILL_CELL_PATTERNS

    heads = args.retrieval_heads
    cells = getattr(args, "head_cells", None)
    if heads and heads < MIN_RETRIEVAL_SAMPLES:
        raise CLIError(
            f"--retrieval-heads {heads}: give at least {MIN_RETRIEVAL_SAMPLES} samples (a standard error needs two)"
        )
    patterns = head_patterns(args)
    if patterns != [STREAMING] and not cells:
        raise CLIError("--head-patterns: give --head-cells BUDGETS too (the budgets of the cells)")
    bad = [p for p in patterns if parse_spec(p)[0] not in PREFILL_CELL_PATTERNS]
    if bad:
        raise CLIError(
            f"--head-patterns: {bad[0]!r} has no head cells (patterns that select per KV head: "
            f"{','.join(PREFILL_CELL_PATTERNS)})"
        )
    try:
        canonical = [canonical_spec(p) for p in patterns]
    except ValueError as err:
        raise CLIError(f"--head-patterns: {err}") from None
    names = [parse_spec(p)[0] for p in canonical]
    if len(set(names)) != len(names):
        raise CLIError(f"--head-patterns: one spec per pattern, got {','.join(patterns)}")
    args.head_patterns = canonical
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


def evidence_samples(args: argparse.Namespace, tokenizer, corpus) -> list:
    """The :func:`head_samples` evidence samples the per-head signals are measured on (drawn before the model
    loads, so that a corpus too short for them is refused before the collection runs)."""
    from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix

    n = head_samples(args)
    return make_calibration_samples(
        tokenizer,
        corpus,
        n_samples=n,
        context_len=args.context_len,
        continuation_len=args.continuation_len,
        seed=args.seed,
        mix=parse_retrieval_mix(str(n), records=args.evidence_records or 1),
    )


def measure(args: argparse.Namespace, table, model, tokenizer, corpus, out, samples, evidence=None) -> None:
    """Retrieval scores (and with ``--head-cells`` the cells of every ``--head-patterns`` pattern) per KV head,
    stored in the table at ``out``; ``samples``: the collection's calibration samples (its prose ones give the
    prose KL); ``evidence``: :func:`evidence_samples`, drawn here if not given. What the table already holds with
    the same settings is kept, not measured again."""
    from polykv_search.data.evidence import EvidenceSample
    from polykv_search.parallel import ModelLoader
    from polykv_search.progress import ProgressBar
    from signals.head_cells import measure_head_cells
    from signals.head_prefill_measure import measure_prefill_cells
    from signals.head_signals import DEFINITION, HeadSignals
    from signals.retrieval_heads import retrieval_scores
    from signals.sample_map import SampleMap
    from strategies.choice import spec_label

    n, records = head_samples(args), args.evidence_records or 1
    budgets = getattr(args, "head_cells", None)
    patterns = head_patterns(args) if budgets else []
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
    old = table.heads if done else None
    cells = old.cells if old is not None and _same_cells(old.cells, budgets, cells_key, CELL_SINK) else None
    old_cells = old.prefill_cells if old is not None else ()
    kept = {spec_label(c.pattern, c.params): c for c in old_cells if _same_cells(c, budgets, cells_key)}
    scored = [p for p in patterns if p != STREAMING and p not in kept]
    streaming = STREAMING in patterns and cells is None
    if STREAMING not in patterns:
        cells = None
    if old is not None and not budgets:
        return  # measured already; no cells asked for
    if old is not None and not (streaming or scored):  # nothing to measure: keep what was asked for
        heads = HeadSignals(old.retrieval, provenance, cells, tuple(kept[p] for p in patterns if p in kept))
        if heads != old:
            table.set_heads(heads)
            table.save(out)
        return
    evidence = evidence if evidence is not None else evidence_samples(args, tokenizer, corpus)
    bar_console = None if args.no_progress else console
    # --jobs: the cells' samples fan out like the grid's units (a worker loads the model once)
    loader = ModelLoader(args.model, args.device, args.dtype, args.attn)
    fan_out = SampleMap(model, loader, args.jobs, args.backend, args.address)
    if done:
        scores = table.heads.retrieval
    else:
        with ProgressBar(bar_console, "retrieval heads", n, unit="samples") as bar:
            scores = retrieval_scores(model, evidence, on_sample=bar.advance)
    if streaming:
        with ProgressBar(bar_console, "streaming cells", n + len(prose), unit="samples") as bar:
            cells = measure_head_cells(
                model,
                evidence,
                prose,
                budgets=budgets,
                sink=CELL_SINK,
                on_sample=bar.advance,
                provenance=cells_key,
                map_samples=fan_out,
            )
    if scored:
        with ProgressBar(bar_console, f"{','.join(scored)} cells", n + len(prose), unit="samples") as bar:
            new = measure_prefill_cells(
                model,
                evidence,
                prose,
                scored,
                budgets=budgets,
                on_sample=bar.advance,
                provenance=cells_key,
                map_samples=fan_out,
            )
        kept.update({spec_label(c.pattern, c.params): c for c in new})
    prefill = tuple(kept[p] for p in patterns if p in kept)
    table.set_heads(HeadSignals(scores, provenance, cells, prefill))
    table.save(out)
    (layer, head, score), *_ = scores.top(1)
    console.print(
        f"retrieval heads: {n} evidence samples; strongest KV head L{layer} kv{head} ({score:.2f})", highlight=False
    )
    for c in ((cells,) if streaming else ()) + tuple(kept[p] for p in scored):
        (layer, head, kl, _), *_ = c.costliest(1, c.budgets[0])
        kind = "streaming" if c is cells else f"{c.pattern} prefill"
        console.print(
            f"{kind} cells: budgets {','.join(map(str, c.budgets))} on {n} evidence + {len(prose)} prose "
            f"samples in {c.provenance['seconds']:.1f}s; costliest at b={c.budgets[0]}: L{layer} kv{head} "
            f"(answer KL {kl:.3f})",
            highlight=False,
        )


def _same_cells(cells, budgets, key, sink=None) -> bool:
    """Whether ``cells`` were measured at ``budgets`` (and ``sink``) on the samples ``key`` describes."""
    if cells is None or not budgets or list(cells.budgets) != sorted(budgets):
        return False
    if sink is not None and cells.sink != sink:
        return False
    return all(cells.provenance.get(k) == v for k, v in key.items())
