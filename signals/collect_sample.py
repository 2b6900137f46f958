"""One sample's collection records: its FullKV pass, then each unit by replay (or naively).

:func:`sample_records` is what the in-process driver (:mod:`signals.collect`) and the worker processes
(:mod:`signals.collect_parallel`) both run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from polykv_search.patterns import make_spec, pattern_spec
from polykv_search.runtime import apply_strategy, model_spec
from signals.collect_assemble import unit_record
from signals.collect_settings import CollectSettings, Unit
from signals.fullkv import full_kv_pass
from signals.naive import NaiveReference, naive_cell
from signals.reconstruction import reconstruction_states
from signals.replay import TokenSignals, replay_unit
from signals.uncertainty import block_means, block_sizes
from strategies import Strategy


def sample_records(
    model,
    context_ids,
    continuation_ids,
    index: int,
    units: Sequence[Unit],
    settings: CollectSettings,
    *,
    need_full: bool,
    scored: tuple[int, int] | None = None,
) -> Iterator[dict]:
    """Records of one sample: its FullKV record (if ``need_full``), then one per unit, as each finishes.

    ``scored``: the ``[start, end)`` continuation positions the signals average over (default all; an
    evidence sample's answer). The whole continuation still runs; only the block means skip the rest.
    """
    num_layers = model_spec(model).num_layers
    span = slice(*(scored or (0, len(continuation_ids))))
    sizes = block_sizes(span.stop - span.start, settings.blocks)
    t0 = time.perf_counter()
    with torch.no_grad(), apply_strategy(model, Strategy.full(num_layers)) as rt:
        record = full_kv_pass(model, rt, context_ids, continuation_ids, phases=settings.phases)
        full = {
            "kind": "full",
            "sample": index,
            "nll": float(record.nll[span].mean()),
            "nll_blocks": block_means(record.nll.numpy()[span], sizes).tolist(),
            "entropy": record.entropy,
            "variance": record.variance,
        }
        if not settings.naive:
            full["seconds"] = time.perf_counter() - t0
            if need_full:
                yield full
            patterns = [make_spec(p) for p in settings.patterns]
            record.reconstruction = reconstruction_states(model, rt, record, context_ids, patterns)
            for unit in units:
                t1 = time.perf_counter()
                tokens = replay_unit(
                    model,
                    rt,
                    record,
                    unit.layer,
                    unit.phase,
                    patterns,
                    settings.budgets,
                    batch_tokens=settings.batch_tokens,
                )
                yield unit_record(unit, _scored(tokens, span), sizes, time.perf_counter() - t1)
            return
    del record
    yield from _naive_records(model, context_ids, continuation_ids, units, settings, full, t0, need_full, sizes, span)


def _naive_records(model, context_ids, continuation_ids, units, settings, full, t0, need_full, sizes, span):
    reference = NaiveReference(model, context_ids, continuation_ids)
    full["nll"] = float(reference.nll[span].mean())
    full["nll_blocks"] = block_means(reference.nll.numpy()[span], sizes).tolist()
    full["seconds"] = time.perf_counter() - t0
    if need_full:
        yield full
    for unit in units:
        t1 = time.perf_counter()
        cells = [
            naive_cell(model, reference, context_ids, continuation_ids, unit.layer, unit.phase, name, budget, params)
            for name, params in map(pattern_spec, settings.patterns)
            for budget in settings.budgets
        ]
        tokens = TokenSignals(*(np.stack([c[k].numpy() for c in cells]) for k in range(3)))
        yield unit_record(unit, _scored(tokens, span), sizes, time.perf_counter() - t1)


def _scored(tokens, span: slice):
    """The per-token signals at the scored continuation positions ``span``."""
    return TokenSignals(tokens.cosine[:, span], tokens.nll[:, span], tokens.kl[:, span])
