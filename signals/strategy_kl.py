"""Whole strategies measured end to end on calibration samples: KL(FullKV ‖ strategy) per sample.

A cell of the signal table applies a pattern in one layer while every other layer keeps FullKV.
Whether the cells add up to a whole strategy is an assumption (sparse evidence lost in one layer is
still held by the others; lost everywhere, it is gone). This module measures the whole strategy
instead: the context is prefilled with every layer's prefill choice, then the continuation is
teacher-forced **one token per call**, so every layer's decoding choice evicts as it would while
generating. The value of a sample is the mean KL(FullKV ‖ strategy) of the next-token
distributions over its scored span (an evidence sample's answer, every token of a prose sample), the
same positions and definition as the table's ``kl`` signal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from polykv_search.data.evidence import scored_span
from signals.naive import naive_run
from signals.ppl import token_kl
from strategies import Strategy


@torch.no_grad()
def strategies_kl(
    model, samples: Sequence, strategies: Sequence[Strategy], *, on_done: Callable[[], None] | None = None
) -> np.ndarray:
    """``[len(samples), len(strategies)]`` float64: each sample's mean KL(FullKV ‖ strategy) over
    its scored span, each strategy applied to the whole model (both phases).

    ``on_done`` is called after each (sample, strategy) run, e.g. to advance a progress bar."""
    if not samples or not strategies:
        raise ValueError("strategies_kl needs at least one sample and one strategy")
    num_layers = int(model.config.num_hidden_layers)
    for s in strategies:
        if s.num_layers != num_layers:
            raise ValueError(f"a strategy has {s.num_layers} layers, the model {num_layers}")
    out = np.empty((len(samples), len(strategies)), dtype=np.float64)
    for i, sample in enumerate(samples):
        start, end = scored_span(sample)
        ctx, cont = sample.context_ids, sample.continuation_ids
        _, _, full = naive_run(model, Strategy.full(num_layers), ctx, cont, stepwise=False, capture_layers=())
        reference = torch.log_softmax(full, dim=-1)[start:end]
        for j, strategy in enumerate(strategies):
            _, _, logits = naive_run(model, strategy, ctx, cont, stepwise=True, capture_layers=())
            out[i, j] = float(token_kl(reference, logits[None, start:end])[0].mean())
            if on_done is not None:
                on_done()
    return out
