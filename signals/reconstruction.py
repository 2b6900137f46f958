"""The reconstruction pass of model-level patterns (``kvzip``) for the replay: once per sample.

A prefill cell (l, kvzip, b) means "layer l alone compresses with kvzip after the pass". The pass
runs before any layer evicts, so it sees the FullKV prompt in every layer whatever the cell: its
per-layer scores are the same for every cell of a sample. :func:`reconstruction_states` runs it once
over the recorded FullKV prompt caches (the runtime's own :func:`~polykv_search.runtime.reconstruction.run_pass`
through the model's decoder) and returns each model-level pattern's state per layer; the replay's
:func:`~signals.replay.prime_layer` installs it where the runtime's pass would have left it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polykv_search.patterns import Pattern, PatternState
from polykv_search.runtime import FULL_PLAN, EvictingLayer, PhasePlan, PolyKVCache
from polykv_search.runtime.reconstruction import run_pass
from signals.fullkv import FullKVRecord


def model_level(patterns: Sequence[Pattern]) -> list[Pattern]:
    """The patterns of ``patterns`` that need the reconstruction pass."""
    return [p for p in patterns if p.model_level]


@torch.no_grad()
def reconstruction_states(
    model, runtime, record: FullKVRecord, context_ids, patterns: Sequence[Pattern]
) -> dict[Pattern, list[PatternState]]:
    """Per model-level pattern, its state in every layer after the pass over ``record``'s FullKV prompt.

    ``runtime``: an applied Full strategy on ``model`` (the ``polykv`` attention is active).
    """
    out: dict[Pattern, list[PatternState]] = {}
    device = record.keys[0].device
    ids = torch.as_tensor(list(context_ids), dtype=torch.long, device=device)[None]
    n = record.context_len
    for pattern in model_level(patterns):
        size = pattern.chunk_size
        if size is None:
            raise ValueError(f"{pattern!r}: a model-level pattern must declare its chunk_size")
        layers = []
        for j in range(len(record.keys)):
            # prefill keeps all, decoding is the pattern: the pass feeds its state, nothing evicts
            layer = EvictingLayer(j, FULL_PLAN, PhasePlan(pattern, n), defer_prefill=True, **runtime.layer_kwargs(j))
            layer.update(record.keys[j], record.values[j])
            layer.attention_call(record.queries[j], None)  # the prompt's hooks, no kernel; defers
            layers.append(layer)
        run_pass(model, PolyKVCache(layers), runtime.pass_inputs(), ids, None, size)
        out[pattern] = [layer.states[pattern] for layer in layers]
    return out
