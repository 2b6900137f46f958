"""The naive path: one full model forward per cell, through the public runtime API.

This is the specification the replay (:mod:`signals.replay`) must reproduce, and the baseline of the
speed comparison. For cell (l, φ, r, b) a strategy that evicts only in layer l (phase φ: pattern r,
budget b; everything else FullKV) is applied with :func:`~polykv_search.runtime.apply_strategy`, the
context is prefilled with ``model(...)``, and the continuation is teacher-forced — in one call for a
prefill cell, one token per call for a decoding cell. A forward hook on decoder layer l records its
output on the continuation (cosine); the logits give the continuation NLL (ΔPPL).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from polykv_search.runtime import apply_strategy
from signals import model_parts
from signals.cosine import cosine_per_row
from signals.ppl import token_nll
from strategies import LayerChoice, Strategy


def single_layer_strategy(num_layers: int, layer: int, phase: str, pattern: str, budget: int | None, params: Mapping[str, Any] | None = None) -> Strategy:
    """FullKV everywhere except ``layer`` in ``phase``: ``pattern`` with ``budget``."""
    full = LayerChoice("full", None)
    prefill, decoding = [full] * num_layers, [full] * num_layers
    if pattern != "full":
        choice = LayerChoice(pattern, int(budget), dict(params or {}))
        (prefill if phase == "prefill" else decoding)[layer] = choice
    return Strategy(list(prefill), list(decoding), None, 1, {"solver": "signals-naive-cell"})


@torch.no_grad()
def naive_run(model, strategy: Strategy, context_ids, continuation_ids, *, stepwise: bool, capture_layers) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Prefill the context, teacher-force the continuation; returns the continuation outputs of the
    ``capture_layers`` (``{layer: [1, m, d]}``) and the per-token NLL ``[m]`` (float64)."""
    device = next(model.parameters()).device
    ctx = torch.as_tensor(context_ids, dtype=torch.long, device=device)[None]
    cont = torch.as_tensor(continuation_ids, dtype=torch.long, device=device)[None]
    m = cont.shape[1]
    captured: dict[int, list[torch.Tensor]] = {j: [] for j in capture_layers}
    recording = [False]

    def hook(j):
        def fn(module, args, output):
            if recording[0]:
                captured[j].append(output[0] if isinstance(output, tuple) else output)

        return fn

    layers = model_parts.decoder_layers(model)
    handles = [layers[j].register_forward_hook(hook(j)) for j in capture_layers]
    try:
        with apply_strategy(model, strategy) as rt:
            cache = rt.new_cache()
            out = model(input_ids=ctx, cache=cache, use_cache=True, logits_to_keep=1)
            nll = [token_nll(out.logits[:, -1:].float(), cont[0, :1])[0]]
            recording[0] = True
            if stepwise:
                step_logits = []
                for t in range(m - 1):
                    step_logits.append(model(input_ids=cont[:, t : t + 1], cache=cache, use_cache=True).logits)
                model(input_ids=cont[:, m - 1 :], cache=cache, use_cache=True, logits_to_keep=1)
                if m > 1:
                    nll.append(token_nll(torch.cat(step_logits, dim=1).float(), cont[0, 1:])[0])
            else:
                logits = model(input_ids=cont, cache=cache, use_cache=True).logits
                if m > 1:
                    nll.append(token_nll(logits[:, :-1].float(), cont[0, 1:])[0])
    finally:
        for h in handles:
            h.remove()
    outputs = {j: torch.cat(v, dim=1) for j, v in captured.items()}
    return outputs, torch.cat(nll).cpu()


class NaiveReference:
    """FullKV outputs of every layer and NLL for one sample, computed the naive way."""

    def __init__(self, model, context_ids, continuation_ids):
        num_layers = len(model_parts.decoder_layers(model))
        self.outputs, self.nll = naive_run(
            model,
            Strategy.full(num_layers),
            context_ids,
            continuation_ids,
            stepwise=False,
            capture_layers=range(num_layers),
        )


def naive_cell(model, reference: NaiveReference, context_ids, continuation_ids, layer: int, phase: str, pattern: str, budget: int, params=None) -> tuple[float, float]:
    """``(cosine, mean NLL)`` of one cell on one sample, by a full forward."""
    num_layers = len(model_parts.decoder_layers(model))
    strategy = single_layer_strategy(num_layers, layer, phase, pattern, budget, params)
    outputs, nll = naive_run(
        model, strategy, context_ids, continuation_ids, stepwise=phase == "decoding", capture_layers=[layer]
    )
    cos = cosine_per_row(outputs[layer], reference.outputs[layer])
    return float(cos[0]), float(nll.mean())
