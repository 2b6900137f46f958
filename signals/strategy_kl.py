"""Whole strategies measured end to end on calibration samples: KL(FullKV ‖ strategy) per sample.

A cell of the signal table applies a pattern in one layer while every other layer keeps FullKV.
Whether the cells add up to a whole strategy is an assumption (sparse evidence lost in one layer is
still held by the others; lost everywhere, it is gone). This module measures the whole strategy
instead: the context is prefilled with every layer's prefill choice, then the continuation is
teacher-forced **one token per call**, so every layer's decoding choice evicts as it would while
generating. The value of a sample is the mean KL(FullKV ‖ strategy) of the next-token
distributions over its scored span (an evidence sample's answer, every token of a prose sample), the
same positions and definition as the table's ``kl`` signal.

:func:`sample_kl` runs one strategy (the reference path); :func:`batched_sample_kl` runs many on one sample at
once by the scoring engine (one FullKV context pass, the continuations batched, still one token per call) and
gives the same values within float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from polykv_search.data.evidence import scored_span
from polykv_search.heap import release_free_memory
from polykv_search.runtime import apply_strategy
from polykv_search.scoring import shared_scorer
from polykv_search.scoring.job import SampleJob
from signals.naive import naive_run
from signals.ppl import token_kl
from strategies import Strategy


@torch.no_grad()
def fullkv_reference(model, sample) -> torch.Tensor:
    """The FullKV next-token log-probabilities of ``sample`` on its scored span, ``[span, V]``: what
    :func:`sample_kl` compares a strategy with (one FullKV run, the continuation in one call)."""
    start, end = scored_span(sample)
    num_layers = int(model.config.num_hidden_layers)
    full = naive_run(
        model, Strategy.full(num_layers), sample.context_ids, sample.continuation_ids, stepwise=False, capture_layers=()
    )[2]
    return torch.log_softmax(full, dim=-1)[start:end]


@torch.no_grad()
def sample_kl(model, sample, strategy: Strategy, reference: torch.Tensor) -> float:
    """Mean KL(FullKV ‖ ``strategy``) over ``sample``'s scored span, ``reference`` from
    :func:`fullkv_reference`; the strategy applied to the whole model, the continuation teacher-forced one
    token per call."""
    start, end = scored_span(sample)
    _, _, logits = naive_run(
        model, strategy, sample.context_ids, sample.continuation_ids, stepwise=True, capture_layers=()
    )
    return float(token_kl(reference, logits[None, start:end])[0].mean())


@torch.no_grad()
def batched_sample_kl(
    model, sample, strategies: Sequence[Strategy], reference: torch.Tensor | None = None, *, batch_entries: int = 16
) -> tuple[list[float], torch.Tensor]:
    """:func:`sample_kl` of every strategy on ``sample`` at once, by the scoring engine (docs/design.md §6b).

    One FullKV context pass serves every strategy's prefill (kvzip's reconstruction pass runs once, for all of
    them); then the continuation is teacher-forced one token per call for all strategies as one batch whose rows
    hold different per-layer lengths (up to ``batch_entries`` rows a batch). Without ``reference``, FullKV joins
    the batch as one more row and its log-probabilities on the scored span (:func:`fullkv_reference`'s, fed one
    token per call) are the reference. Returns the values (in ``strategies``' order) and the reference used."""
    num_layers = int(model.config.num_hidden_layers)
    rows = [*strategies, Strategy.full(num_layers)] if reference is None else list(strategies)
    job = SampleJob(
        "teacher_forced", list(sample.context_ids), [], target_ids=list(sample.continuation_ids), stepwise=True
    )
    with apply_strategy(model, Strategy.full(num_layers)) as runtime:
        scorer, runs = shared_scorer(model, runtime, rows, batch_entries=batch_entries)
        outcomes = scorer.run(job, fidelity=False)
    start, end = scored_span(sample)
    logits = [outcomes[k].logits[start:end].float() for k, _ in runs]
    if reference is None:
        reference = torch.log_softmax(logits.pop(), dim=-1)
    values = [float(token_kl(reference, lg[None])[0].mean()) for lg in logits]
    release_free_memory()  # the sample's caches are gone
    return values, reference


def check_layers(model, strategies: Sequence[Strategy]) -> None:
    """Raise ``ValueError`` when a strategy's layer count is not the model's."""
    num_layers = int(model.config.num_hidden_layers)
    for s in strategies:
        if s.num_layers != num_layers:
            raise ValueError(f"a strategy has {s.num_layers} layers, the model {num_layers}")


def strategies_kl(
    model, samples: Sequence, strategies: Sequence[Strategy], *, on_done: Callable[[], None] | None = None
) -> np.ndarray:
    """``[len(samples), len(strategies)]`` float64: each sample's mean KL(FullKV ‖ strategy) over
    its scored span, each strategy applied to the whole model (both phases).

    ``on_done`` is called after each (sample, strategy) run, e.g. to advance a progress bar."""
    if not samples or not strategies:
        raise ValueError("strategies_kl needs at least one sample and one strategy")
    check_layers(model, strategies)
    out = np.empty((len(samples), len(strategies)), dtype=np.float64)
    for i, sample in enumerate(samples):
        reference = fullkv_reference(model, sample)
        for j, strategy in enumerate(strategies):
            out[i, j] = sample_kl(model, sample, strategy, reference)
            if on_done is not None:
                on_done()
    return out
