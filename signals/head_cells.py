"""Streaming cells per (layer, KV head): what it costs when only one KV head keeps sinks + recent tokens.

The DuoAttention ablation (Xiao et al. 2410.10819 fit a gate per head by gradient training), done offline
and exactly: for a layer ``l``, a KV head ``h`` and a budget ``b`` of a small grid, the *cell* is the model
with everything FullKV except that the query heads reading KV head ``h`` of layer ``l`` see, from every
continuation query at position ``p``, only the first ``sink`` tokens and the ``b - sink`` tokens before
``p`` (plus ``p`` itself)::

    key k visible to query p   <=>   k <= p  and  (k < sink  or  k >= p - (b - sink))

Prompt queries see the whole prompt, as in the runtime, where the prompt's own attention runs on the full
prompt and compression follows its kernel. So the cell is exactly that head in a ``streaming_llm`` group
(``n_sink = sink``) with budget ``b`` in both phases, evicting after every step, the continuation
teacher-forced token by token: prefill keeps sinks + the prompt's last ``b - sink`` tokens, and each
decoding step appends one token and evicts the oldest non-sink one.

Signals per cell: ``KL(FullKV || cell)`` of the next-token distributions, averaged over the *answer* tokens
of evidence samples (:mod:`polykv_search.data.evidence`, their ``scored`` span) and over every continuation
token of prose samples (0 at the first, which the context predicts, as in :mod:`signals.ppl`). Each sample's
mean counts once; the stored value is the mean over samples and its standard error (``scipy.stats.sem``;
null with one sample).

Fast and exact (no full forward per cell): one FullKV pass per sample (:func:`signals.fullkv.full_kv_pass`)
records each layer's prompt K/V and continuation input. Layer ``l``'s cells, every (KV head, budget), run
as rows of one batch from that recorded input: layer ``l`` with a per-(row, KV head) mask
(:func:`streaming_heads_mask`, a cache layer's ``mask``: the runtime's extension point), then layers ``l+1..L`` over the
recorded prompt caches (unchanged: prompt queries are not masked) and the head on the scored positions.
An evidence sample's continuation is cut after its answer (causal: later tokens cannot change it). Cost per
sample: for each layer ``l``, ``L - l`` layer calls of ``H * len(budgets)`` rows of ``m`` tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from scipy import stats

from polykv_search.data.evidence import scored_span
from polykv_search.runtime import FULL_PLAN, EvictingLayer, PolyKVCache, apply_strategy, model_spec
from signals import model_parts
from signals.fullkv import FullKVRecord, full_kv_pass
from signals.head_signals import CELL_PATTERN, HeadCells
from signals.ppl import token_kl
from signals.replay import shared_prompt_layer, shared_prompt_mask
from signals.sample_map import SampleMap
from strategies import Strategy

DEFAULT_BUDGETS: tuple[int, ...] = (32, 64, 128)
DEFAULT_SINK = 4
#: Continuation tokens (rows x m) run through the upper layers at once.
BATCH_TOKENS = 8192

DEFINITION = (
    "KL(FullKV || cell), cell = only the query heads of KV head h in layer l see, from each continuation query "
    "p, the keys k <= p with k < sink or k >= p - (b - sink) (streaming_llm at budget b in both phases, "
    "evicting every step; prompt queries unmasked); answer: mean over the answer tokens of each evidence "
    "sample; prose: mean over every continuation token of each prose sample (0 at the first); mean over "
    "samples, se = standard error over samples"
)


def streaming_heads_mask(heads: Sequence[int], budgets: Sequence[int], sink: int):
    """The mask of the rows of layer ``l``'s cells: row ``r`` masks KV head ``heads[r]`` to sinks + the
    ``budgets[r] - sink`` tokens before each query (the others see the shared prompt causally)."""

    def mask(layer, query_positions: torch.Tensor | range) -> torch.Tensor:
        cell_heads = torch.as_tensor(heads, device=layer.device)
        windows = torch.as_tensor([b - sink for b in budgets], device=layer.device)
        causal = shared_prompt_mask(layer, query_positions)  # [1, 1, q, n]
        qpos = torch.as_tensor(query_positions, device=layer.device)[None, :, None]  # [1, q, 1]
        kpos = torch.arange(causal.shape[-1], device=layer.device)[None, None, :]
        stream = (kpos < sink) | (kpos >= qpos - windows[:, None, None])  # [rows, q, n]
        mine = torch.arange(layer.keys.shape[1], device=layer.device)[None, :] == cell_heads[:, None]
        return causal & (stream[:, None] | ~mine[:, :, None, None])  # [rows, Hkv, q, n]

    return mask


def streaming_heads_layer(runtime, record: FullKVRecord, layer_idx: int, heads, budgets, sink: int):
    """:func:`signals.replay.shared_prompt_layer` for ``len(heads)`` rows, masked by :func:`streaming_heads_mask`."""
    return shared_prompt_layer(runtime, record, layer_idx, len(heads), streaming_heads_mask(heads, budgets, sink))


def _placeholder(runtime, layer_idx: int) -> EvictingLayer:
    """An empty FullKV layer for the slots the replay never calls (or has finished with)."""
    return EvictingLayer(layer_idx, FULL_PLAN, FULL_PLAN, **{**runtime.layer_kwargs(layer_idx), "on_update": None})


def scored_kl(model, hidden: torch.Tensor, record: FullKVRecord, span: tuple[int, int]) -> torch.Tensor:
    """``KL(FullKV || row)`` per row at continuation positions ``span`` (float64 ``[C, end - start]``) from
    the last layer's output ``hidden`` ``[C, m', d]``; position 0 (predicted by the context) is 0."""
    start, end = span
    c = hidden.shape[0]
    first = max(start, 1)
    parts = [torch.zeros((c, first - start), dtype=torch.float64)]
    if end > first:
        logits = model_parts.logits(model, hidden[:, first - 1 : end - 1])
        parts.append(token_kl(record.logprobs[first - 1 : end - 1], logits).cpu())
    return torch.cat(parts, dim=1)


def rows_kl(model, runtime, record: FullKVRecord, layer_idx: int, make_layer, rows: int, span) -> torch.Tensor:
    """KL per row: layer ``layer_idx`` = ``make_layer()`` (``rows`` rows), then layers above over the
    recorded prompt caches; ``[rows, end - start]``."""
    num_layers = len(record.keys)
    layers: list[Any] = [_placeholder(runtime, j) for j in range(num_layers)]
    layers[layer_idx] = make_layer()
    cache = PolyKVCache(layers)
    pos = record.position_ids(record.hidden[0].device)
    hidden = record.hidden[layer_idx].expand(rows, -1, -1)
    pe = model_parts.rotary(model, hidden, pos)
    hidden = model_parts.run_layer(model, layer_idx, hidden, pe, pos, cache)
    cache.layers[layer_idx] = _placeholder(runtime, layer_idx)  # free its K/V copy
    for j in range(layer_idx + 1, num_layers):
        cache.layers[j] = shared_prompt_layer(runtime, record, j, rows)
        hidden = model_parts.run_layer(model, j, hidden, pe, pos, cache)
        cache.layers[j] = layers[j]  # free the expanded prompt cache
    return scored_kl(model, hidden, record, span)


@torch.no_grad()
def layer_cells_kl(
    model,
    runtime,
    record: FullKVRecord,
    layer_idx: int,
    budgets: Sequence[int],
    sink: int,
    span: tuple[int, int],
    *,
    batch_tokens: int = BATCH_TOKENS,
) -> torch.Tensor:
    """Per-token KL of every (KV head, budget) cell of layer ``layer_idx`` on one sample:
    ``[Hkv, len(budgets), end - start]`` float64 (``runtime``: an applied Full strategy)."""
    hkv = record.keys[layer_idx].shape[1]
    cells = [(h, b) for h in range(hkv) for b in budgets]
    per_chunk = max(1, batch_tokens // max(record.continuation_len, 1))
    out = []
    for at in range(0, len(cells), per_chunk):
        chunk = cells[at : at + per_chunk]
        heads, widths = [h for h, _ in chunk], [b for _, b in chunk]

        def make(heads=heads, widths=widths):
            return streaming_heads_layer(runtime, record, layer_idx, heads, widths, sink)

        out.append(rows_kl(model, runtime, record, layer_idx, make, len(chunk), span))
    return torch.cat(out).reshape(hkv, len(budgets), -1)


@torch.no_grad()
def sample_cells_kl(
    model, sample, budgets: Sequence[int], sink: int, *, layers: Sequence[int] | None = None, batch_tokens=BATCH_TOKENS
) -> np.ndarray:
    """Mean KL over ``sample``'s scored tokens of every cell: ``[L, Hkv, len(budgets)]`` (layers not in
    ``layers`` stay NaN). An evidence sample's continuation runs only up to the end of its answer."""
    spec = model_spec(model)
    start, end = scored_span(sample)
    continuation = list(sample.continuation_ids)[:end]
    result = np.full((spec.num_layers, spec.num_kv_heads, len(budgets)), np.nan)
    with apply_strategy(model, Strategy.full(spec.num_layers)) as rt:
        record = full_kv_pass(model, rt, sample.context_ids, continuation, stats=False)
        for layer in range(spec.num_layers) if layers is None else layers:
            kl = layer_cells_kl(model, rt, record, layer, budgets, sink, (start, end), batch_tokens=batch_tokens)
            result[layer] = kl.mean(dim=-1).numpy()
    return result


def check_cell_budgets(budgets: Sequence[int], sink: int) -> tuple[int, ...]:
    """Distinct budgets, sorted, each above ``sink`` (a budget of ``sink`` or less keeps no recent token)."""
    if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise ValueError(f"sink: must be a non-negative integer, got {sink!r}")
    out = tuple(sorted({int(b) for b in budgets}))
    if not out or len(out) != len(budgets) or out[0] <= sink:
        raise ValueError(f"budgets: need distinct integers above the sink ({sink}), got {list(budgets)}")
    return out


def cells_per_sample(
    model, samples: Sequence, budgets, sink: int, *, batch_tokens=BATCH_TOKENS, on_sample=None, map_samples=None
):
    """:func:`sample_cells_kl` of each sample, stacked: ``[S, L, Hkv, len(budgets)]``; ``map_samples``: a
    :class:`~signals.sample_map.SampleMap` (workers), else each sample runs here on ``model``."""
    run = map_samples or SampleMap(model)
    return np.stack(
        run(partial(sample_cells_kl, batch_tokens=batch_tokens), samples, budgets, sink, on_sample=on_sample)
    )


def measure_head_cells(
    model,
    evidence: Sequence,
    prose: Sequence,
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    sink: int = DEFAULT_SINK,
    batch_tokens: int = BATCH_TOKENS,
    on_sample: Callable[[], None] | None = None,
    provenance: dict[str, Any] | None = None,
    map_samples: SampleMap | None = None,
) -> HeadCells:
    """The streaming cells of every (layer, KV head, budget) of ``model`` (see the module docstring):
    answer KL on the ``evidence`` samples (each with a ``scored`` answer span), prose KL on ``prose``."""
    budgets = check_cell_budgets(budgets, sink)
    if not evidence or not prose:
        raise ValueError("streaming cells need at least one evidence sample and one prose sample")
    started = time.perf_counter()
    per = {
        name: cells_per_sample(
            model, samples, budgets, sink, batch_tokens=batch_tokens, on_sample=on_sample, map_samples=map_samples
        )
        for name, samples in (("answer", evidence), ("prose", prose))
    }
    summary = {name: summarize_samples(v) for name, v in per.items()}
    prov = {
        "definition": DEFINITION,
        "evidence_samples": len(evidence),
        "prose_samples": len(prose),
        "seconds": round(time.perf_counter() - started, 3),
        **(provenance or {}),
    }
    return HeadCells(sink, budgets, *summary["answer"], *summary["prose"], prov, pattern=CELL_PATTERN)


def summarize_samples(per_sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = per_sample.mean(axis=0)
    if per_sample.shape[0] < 2:
        return mean, np.full(mean.shape, np.nan)
    return mean, np.asarray(stats.sem(per_sample, axis=0))
