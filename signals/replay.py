"""Fast cell evaluation by replay: no full forward per cell.

For a sample's :class:`~signals.fullkv.FullKVRecord` and a layer l, all (pattern, budget) cells of a
phase are evaluated together:

1. **Layer l's cache per cell, without a kernel.** A detached :class:`EvictingLayer` gets the FullKV
   prompt K/V; the pattern's ``pre_kernel``/``post_kernel`` hooks run on the recorded prompt queries
   — exactly what the runtime does during the prompt's own attention call — once per pattern, since
   the statistics do not depend on the budget. Each budget then gets a fork (``EvictingLayer.forked``:
   tensors shared, pattern state copied) whose ``end_call`` compresses it (prefill cells) or that keeps
   it whole with the decoding pattern's state primed (decoding cells).
2. **Layer l on the continuation, cells batched.** The cells' layers (different lengths, patterns,
   budgets) become one decoding batch (:func:`~polykv_search.runtime.layouts.row_parts`, as the scorer's):
   one right-padded store (padding is invalid, so masked exactly) whose rows that share a decoding pattern
   score and evict together, each to its own budget, so each row keeps exactly the tokens it would keep
   alone; a pooled allocation's row (heads of different lengths) is a group of its own. Prefill cells:
   the m continuation tokens in one call. Decoding cells: teacher-forced, one token per step, evicting as
   the runtime does. Layers below l are FullKV, so their continuation outputs are the recorded ones.
3. **Layers l+1..L once for all cells**, in one call of m tokens with the FullKV prompt caches
   expanded to the batch (layers above l do not evict, so step-by-step and one-call decoding agree);
   then the final norm and head give the continuation's per-token NLL and KL(FullKV ‖ cell) against
   the recorded FullKV log-probabilities. Cosine needs only layer l's output.

Every signal comes back per token (:class:`TokenSignals`); the driver averages them into token
blocks for the standard errors (:mod:`signals.uncertainty`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from polykv_search.patterns import Pattern
from polykv_search.runtime import FULL_PLAN, EvictingLayer, PhasePlan, PolyKVCache, RuntimeLayer
from polykv_search.runtime.layer import DECODING, PREFILL
from polykv_search.runtime.layouts import row_parts
from polykv_search.runtime.pooled import allocate
from signals import model_parts
from signals.cosine import cosine_per_token
from signals.fullkv import FullKVRecord
from signals.model_parts import SMALL_OP_THREADS, cpu_threads
from signals.ppl import continuation_token_stats

#: Continuation tokens (rows × m) run through the upper layers at once.
BATCH_TOKENS = 8192


def _detached(runtime, layer_idx: int, prefill: PhasePlan, decoding: PhasePlan, cls=EvictingLayer, **extra):
    kwargs = {**runtime.layer_kwargs(layer_idx), "on_update": None}
    return cls(layer_idx, prefill, decoding, **kwargs, **extra)


def prime_layer(
    runtime, record: FullKVRecord, layer_idx: int, prefill: PhasePlan, decoding: PhasePlan
) -> EvictingLayer:
    """A detached layer holding the FullKV prompt after its prefill call's hooks ran (``end_call``
    not yet called): the state the runtime's layer l is in right after the prompt's kernel (and, for
    a model-level pattern, after the reconstruction pass: ``record.reconstruction``)."""
    layer = _detached(runtime, layer_idx, prefill, decoding)
    layer.update(record.keys[layer_idx], record.values[layer_idx])
    layer.attention_call(record.queries[layer_idx], None, finish=False)  # the prompt's hooks, without a kernel
    for pattern, _ in layer.model_level_states():
        states = record.reconstruction.get(pattern)
        if states is None:
            raise RuntimeError(f"the FullKV record has no reconstruction pass for {pattern.name}")
        layer.states[pattern].replace_with(states[layer_idx])
    return layer


def shared_prompt_mask(layer, query_positions: torch.Tensor | range) -> torch.Tensor:
    """The mask of a :func:`shared_prompt_layer`: nothing is evicted, so every row and head has the same
    positions and one ``[1, 1, q, n]`` mask serves them all (SDPA then runs with native GQA instead of
    per-head masks)."""
    kpos = layer.positions[:1, :1, None, :]
    qpos = torch.as_tensor(query_positions, device=layer.device)[None, None, :, None]
    allowed = kpos <= qpos
    if layer.sliding_window is not None:
        allowed &= (qpos - kpos) < layer.sliding_window
    return allowed


def shared_prompt_layer(runtime, record: FullKVRecord, layer_idx: int, rows: int, mask=None) -> EvictingLayer:
    """An upper layer's cache for ``rows`` rows after the prompt's (non-evicting) prefill: the FullKV prompt
    (an expanded view, copied once when the continuation is appended) plus each row's own continuation,
    masked by ``mask(layer, query_positions)`` (default :func:`shared_prompt_mask`)."""
    kwargs = runtime.layer_kwargs(layer_idx)
    layer = EvictingLayer(layer_idx, FULL_PLAN, FULL_PLAN, mask=mask or shared_prompt_mask, **kwargs)
    keys, values = record.keys[layer_idx], record.values[layer_idx]
    b, h, n, _ = keys.shape
    layer.device = keys.device
    layer.keys = keys.expand(rows, -1, -1, -1)
    layer.values = values.expand(rows, -1, -1, -1)
    layer.positions = torch.arange(n, device=keys.device).expand(rows, h, n)
    layer.valid = torch.ones((), dtype=torch.bool, device=keys.device).expand(rows, h, n)
    layer.is_initialized = True
    layer.seen = n
    layer.calls = 1
    return layer


def cell_layers(
    runtime, record: FullKVRecord, layer_idx: int, phase: str, patterns: Sequence[Pattern], budgets: Sequence[int]
) -> list[EvictingLayer]:
    """Layer ``layer_idx``'s cache of every (pattern, budget) cell (pattern-major), right after prefill."""
    rows = []
    for pattern in patterns:
        if phase == "prefill":
            base = prime_layer(runtime, record, layer_idx, PhasePlan(pattern, budgets[0]), FULL_PLAN)
            for b in budgets:
                row = base.forked(PhasePlan(pattern, b), FULL_PLAN)
                allocate([[row]], PREFILL)  # a pooled pattern's pool: layer l alone, as the naive cell's runtime
                row.end_call()  # compress the prompt to b
                rows.append(row)
        else:
            base = prime_layer(runtime, record, layer_idx, FULL_PLAN, PhasePlan(pattern, budgets[0]))
            base.end_call()  # prefill keeps all; only the decoding pattern's state survives
            for b in budgets:
                row = base.forked(FULL_PLAN, PhasePlan(pattern, b))
                allocate([[row]], DECODING)
                rows.append(row)
    return rows


@dataclass(frozen=True)
class TokenSignals:
    """Per-token signals of several cells on one sample: float64 arrays ``[cells, m]``."""

    cosine: np.ndarray
    nll: np.ndarray
    kl: np.ndarray

    @classmethod
    def concat(cls, parts: Sequence[TokenSignals]) -> TokenSignals:
        return cls(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("cosine", "nll", "kl")))


@torch.no_grad()
def replay_unit(
    model,
    runtime,
    record: FullKVRecord,
    layer_idx: int,
    phase: str,
    patterns: Sequence[Pattern],
    budgets: Sequence[int],
    *,
    batch_tokens: int = BATCH_TOKENS,
) -> TokenSignals:
    """Per-token cosine, NLL and KL of every (pattern, budget) cell of (layer, phase) on one sample.

    ``runtime``: an applied Full strategy on ``model`` (so the ``polykv`` attention is active).
    Rows are pattern-major (``[p * len(budgets) + b]``).
    """
    with cpu_threads(SMALL_OP_THREADS):
        rows = cell_layers(runtime, record, layer_idx, phase, patterns, budgets)
    per_chunk = max(1, batch_tokens // max(record.continuation_len, 1))
    parts = [
        _continue(model, runtime, record, layer_idx, phase, rows[start : start + per_chunk])
        for start in range(0, len(rows), per_chunk)
    ]
    return TokenSignals.concat(parts)


def _continue(model, runtime, record: FullKVRecord, layer_idx: int, phase: str, rows) -> TokenSignals:
    device = record.hidden[0].device
    num_layers = len(record.keys)
    m, c = record.continuation_len, len(rows)
    layers: list[RuntimeLayer] = [_detached(runtime, j, FULL_PLAN, FULL_PLAN) for j in range(num_layers)]
    layers[layer_idx] = row_parts(layer_idx, rows, None, **runtime.layer_kwargs(layer_idx))
    cache = PolyKVCache(layers)
    pos = record.position_ids(device)
    hidden = record.hidden[layer_idx].expand(c, -1, -1)
    pe = model_parts.rotary(model, hidden, pos)
    if phase == "prefill":
        out = model_parts.run_layer(model, layer_idx, hidden, pe, pos, cache)
    else:
        steps = []
        with cpu_threads(SMALL_OP_THREADS):
            for t in range(m):
                steps.append(
                    model_parts.run_layer(
                        model,
                        layer_idx,
                        hidden[:, t : t + 1],
                        model_parts.slice_rotary(pe, t, t + 1),
                        pos[:, t : t + 1],
                        cache,
                    )
                )
        out = torch.cat(steps, dim=1)
    cosine = cosine_per_token(out, record.hidden[layer_idx + 1]).cpu()
    hidden = out
    for j in range(layer_idx + 1, num_layers):
        cache.layers[j] = shared_prompt_layer(runtime, record, j, c)
        hidden = model_parts.run_layer(model, j, hidden, pe, pos, cache)
        cache.layers[j] = layers[j]  # free the expanded prompt cache
    nll, kl = continuation_token_stats(model, hidden, record.continuation, float(record.nll[0]), record.logprobs)
    return TokenSignals(cosine.numpy(), nll.numpy(), kl.numpy())
