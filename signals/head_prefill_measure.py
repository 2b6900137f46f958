"""Prefill head cells of scored patterns: per (layer, KV head, budget), the KL to FullKV when only that KV head
compresses its prompt with the pattern (its own per-head selection) and keeps every continuation token (the
streaming cells' companion for H2O, SnapKV, KVzip, ...; :mod:`signals.head_cells` has the shared replay)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from polykv_search.data.evidence import scored_span
from polykv_search.patterns import checked_params, make_pattern
from polykv_search.patterns.spec import parse_spec
from polykv_search.runtime import apply_strategy, model_spec
from signals.fullkv import FullKVRecord, full_kv_pass
from signals.head_cells import BATCH_TOKENS, DEFAULT_BUDGETS, rows_kl, summarize_samples
from signals.head_prefill_cells import PREFILL_CELL_PATTERNS, PrefillCells
from signals.head_signals import CELL_PATTERN
from signals.reconstruction import reconstruction_states
from signals.replay import cell_layers, shared_prompt_layer, shared_prompt_mask
from signals.sample_map import SampleMap
from strategies import Strategy

PREFILL_DEFINITION = (
    "KL(FullKV || cell), cell = only KV head h of layer l compresses its prompt to budget b with the pattern "
    "(its own per-head selection, as in a head group of its own) and keeps every continuation token; other "
    "heads and layers FullKV; answer and prose means and se as for the streaming cells"
)


def kept_prompt_mask(heads: Sequence[int], kept: torch.Tensor):
    """The mask of layer ``l``'s prefill head cells: row ``r`` lets KV head ``heads[r]`` see, of the prompt,
    only ``kept[r]`` ``[prompt_len]`` bool (its pattern's prefill selection), and every continuation token
    (causally)."""

    def mask(layer, query_positions: torch.Tensor | range) -> torch.Tensor:
        cell_heads = torch.as_tensor(heads, device=layer.device)
        cell_kept = kept.to(layer.device)  # [rows, prompt_len] bool
        causal = shared_prompt_mask(layer, query_positions)  # [1, 1, q, n]
        n, prompt = causal.shape[-1], cell_kept.shape[-1]
        keep = torch.ones((len(cell_heads), n), dtype=torch.bool, device=layer.device)
        keep[:, :prompt] = cell_kept
        mine = torch.arange(layer.keys.shape[1], device=layer.device)[None, :] == cell_heads[:, None]
        return causal & (keep[:, None, None, :] | ~mine[:, :, None, None])  # [rows, Hkv, q, n]

    return mask


def prefill_kept(runtime, record: FullKVRecord, layer_idx: int, pattern, budgets: Sequence[int]) -> torch.Tensor:
    """``[len(budgets), Hkv, prompt_len]`` bool: the prompt tokens layer ``layer_idx`` keeps in each KV head
    when ``pattern`` compresses it to each budget (the collector's replay, :func:`signals.replay.cell_layers`)."""
    rows = cell_layers(runtime, record, layer_idx, "prefill", [pattern], budgets)
    n = record.keys[layer_idx].shape[2]
    kept = torch.zeros((len(budgets), record.keys[layer_idx].shape[1], n), dtype=torch.bool)
    for g, row in enumerate(rows):
        kept[g].scatter_(-1, row.positions[0].cpu(), True)
    return kept


@torch.no_grad()
def layer_prefill_cells_kl(
    model, runtime, record: FullKVRecord, layer_idx: int, pattern, budgets, span, *, batch_tokens=BATCH_TOKENS
) -> torch.Tensor:
    """Per-token KL of every (KV head, budget) prefill cell of ``pattern`` in layer ``layer_idx``: only that
    head compresses its prompt with the pattern (every other head and layer FullKV) and keeps every
    continuation token; ``[Hkv, len(budgets), end - start]`` float64."""
    if pattern.name not in PREFILL_CELL_PATTERNS:
        raise ValueError(f"prefill head cells: {pattern.name!r} does not select per KV head")
    kept = prefill_kept(runtime, record, layer_idx, pattern.alone(), budgets)  # [nb, H, n]
    hkv = kept.shape[1]
    cells = [(h, g) for h in range(hkv) for g in range(len(budgets))]
    per_chunk = max(1, batch_tokens // max(record.continuation_len, 1))
    out = []
    for at in range(0, len(cells), per_chunk):
        chunk = cells[at : at + per_chunk]

        def make(chunk=chunk):
            mask = kept_prompt_mask([h for h, _ in chunk], torch.stack([kept[g, h] for h, g in chunk]))
            return shared_prompt_layer(runtime, record, layer_idx, len(chunk), mask)

        out.append(rows_kl(model, runtime, record, layer_idx, make, len(chunk), span))
    return torch.cat(out).reshape(hkv, len(budgets), -1)


@torch.no_grad()
def sample_prefill_cells_kl(model, sample, pattern, budgets: Sequence[int], *, batch_tokens=BATCH_TOKENS) -> np.ndarray:
    """Mean KL over ``sample``'s scored tokens of every prefill cell of ``pattern``: ``[L, Hkv, len(budgets)]``."""
    return samples_prefill_cells_kl(model, sample, [pattern], budgets, batch_tokens=batch_tokens)[0]


@torch.no_grad()
def samples_prefill_cells_kl(
    model, sample, patterns: Sequence, budgets: Sequence[int], *, batch_tokens=BATCH_TOKENS, seconds=None
) -> list[np.ndarray]:
    """:func:`sample_prefill_cells_kl` of each pattern, sharing one FullKV pass; ``seconds`` (a list, one
    entry per pattern) accumulates each pattern's time (its share of the pass included)."""
    spec = model_spec(model)
    start, end = scored_span(sample)
    continuation = list(sample.continuation_ids)[:end]
    results = [np.full((spec.num_layers, spec.num_kv_heads, len(budgets)), np.nan) for _ in patterns]
    with apply_strategy(model, Strategy.full(spec.num_layers)) as rt:
        began = time.perf_counter()
        record = full_kv_pass(model, rt, sample.context_ids, continuation, stats=False)
        shared = (time.perf_counter() - began) / max(len(patterns), 1)
        for i, pattern in enumerate(patterns):
            began = time.perf_counter()
            if pattern.model_level:  # its reconstruction pass, counted in its own time
                record.reconstruction = reconstruction_states(model, rt, record, sample.context_ids, [pattern.alone()])
            for layer in range(spec.num_layers):
                kl = layer_prefill_cells_kl(
                    model, rt, record, layer, pattern, budgets, (start, end), batch_tokens=batch_tokens
                )
                results[i][layer] = kl.mean(dim=-1).numpy()
            if seconds is not None:
                seconds[i] += shared + time.perf_counter() - began
    return results


def _prefill_sample(model, sample, patterns, budgets, batch_tokens) -> tuple[list[np.ndarray], list[float]]:
    """:func:`samples_prefill_cells_kl` of one sample and each pattern's seconds on it."""
    seconds = [0.0] * len(patterns)
    return samples_prefill_cells_kl(
        model, sample, patterns, budgets, batch_tokens=batch_tokens, seconds=seconds
    ), seconds


def measure_prefill_cells(
    model,
    evidence: Sequence,
    prose: Sequence,
    patterns: Sequence[str],
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    batch_tokens: int = BATCH_TOKENS,
    on_sample: Callable[[], None] | None = None,
    provenance: dict[str, Any] | None = None,
    map_samples: SampleMap | None = None,
) -> tuple[PrefillCells, ...]:
    """The prefill cells of every scored pattern in ``patterns`` (specs: ``h2o``, ``kvzip[allocation=model]``)
    per (layer, KV head, budget): answer KL on ``evidence``, prose KL on ``prose`` (as
    :func:`~signals.head_cells.measure_head_cells`); each block records the spec's params and its own
    ``seconds``. ``on_sample`` is called once per sample (all patterns); ``map_samples`` as
    :func:`~signals.head_cells.cells_per_sample`'s (``seconds`` then sums the workers' times)."""
    budgets = tuple(sorted({int(b) for b in budgets}))
    specs = [parse_spec(p) for p in patterns]
    bad = [p for p, (name, _) in zip(patterns, specs) if name not in PREFILL_CELL_PATTERNS or name == CELL_PATTERN]
    if bad or not patterns or not budgets or budgets[0] < 1:
        raise ValueError(f"prefill cells: scored patterns of {list(PREFILL_CELL_PATTERNS[:-1])}, got {list(patterns)}")
    if not evidence or not prose:
        raise ValueError("prefill cells need at least one evidence sample and one prose sample")
    made = [make_pattern(name, **params) for name, params in specs]
    seconds = [0.0] * len(made)
    per: dict[str, list[list[np.ndarray]]] = {"answer": [], "prose": []}
    run = map_samples or SampleMap(model)
    for name, samples in (("answer", evidence), ("prose", prose)):
        for rows, took in run(_prefill_sample, samples, made, budgets, batch_tokens, on_sample=on_sample):
            per[name].append(rows)
            seconds = [a + b for a, b in zip(seconds, took)]
    out = []
    for i, (pattern, params) in enumerate(specs):
        answer = summarize_samples(np.stack([row[i] for row in per["answer"]]))
        prose_kl = summarize_samples(np.stack([row[i] for row in per["prose"]]))
        prov = {
            "definition": PREFILL_DEFINITION,
            "evidence_samples": len(evidence),
            "prose_samples": len(prose),
            "seconds": round(seconds[i], 3),
            **(provenance or {}),
        }
        out.append(PrefillCells(pattern, budgets, *answer, *prose_kl, checked_params(pattern, params), prov))
    return tuple(out)
