"""The naive path: one full model forward per cell, through the public runtime API.

This is the specification the replay (:mod:`signals.replay`) must reproduce, and the baseline of the
speed comparison. For cell (l, φ, r, b) a strategy that evicts only in layer l (phase φ: pattern r,
budget b; everything else FullKV) is applied with :func:`~polykv_search.runtime.apply_strategy`, the
context is prefilled with ``model(...)``, and the continuation is teacher-forced — in one call for a
prefill cell, one token per call for a decoding cell. A forward hook on decoder layer l records its
output on the continuation (cosine); the logits give the continuation's per-token NLL (ΔPPL) and,
against the FullKV run's log-probabilities, KL(FullKV ‖ cell) at every position (position 0
included: it is computed, not assumed to be 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from polykv_search.runtime import apply_strategy
from signals import model_parts
from signals.cosine import cosine_per_token
from signals.ppl import token_kl, token_nll
from strategies import LayerChoice, Strategy


def single_layer_strategy(
    num_layers: int, layer: int, phase: str, pattern: str, budget: int, params: Mapping[str, Any] | None = None
) -> Strategy:
    """FullKV everywhere except ``layer`` in ``phase``: ``pattern`` with ``budget``."""
    full = LayerChoice("full", None)
    prefill, decoding = [full] * num_layers, [full] * num_layers
    if pattern != "full":
        choice = LayerChoice(pattern, int(budget), dict(params or {}))
        (prefill if phase == "prefill" else decoding)[layer] = choice
    return Strategy(list(prefill), list(decoding), None, 1, {"solver": "signals-naive-cell"})


@torch.no_grad()
def naive_run(
    model, strategy: Strategy, context_ids, continuation_ids, *, stepwise: bool, capture_layers
) -> tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Prefill the context, teacher-force the continuation; returns the continuation outputs of the
    ``capture_layers`` (``{layer: [1, m, d]}``), the per-token NLL ``[m]`` (float64) and the
    next-token logits ``[m, V]`` (position t predicts x_t)."""
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
            logits = [out.logits[0, -1:].float()]
            recording[0] = True
            if stepwise:
                step_logits = []
                for t in range(m - 1):
                    step_logits.append(model(input_ids=cont[:, t : t + 1], cache=cache, use_cache=True).logits)
                model(input_ids=cont[:, m - 1 :], cache=cache, use_cache=True, logits_to_keep=1)
                logits.extend(lg[0].float() for lg in step_logits)
            else:
                logits.append(model(input_ids=cont, cache=cache, use_cache=True).logits[0, :-1].float())
    finally:
        for h in handles:
            h.remove()
    outputs = {j: torch.cat(v, dim=1) for j, v in captured.items()}
    stacked = torch.cat(logits)  # [m, V]
    return outputs, token_nll(stacked[None], cont[0])[0].cpu(), stacked


class NaiveReference:
    """FullKV outputs of every layer and NLL for one sample, computed the naive way."""

    def __init__(self, model, context_ids, continuation_ids):
        num_layers = len(model_parts.decoder_layers(model))
        self.outputs, self.nll, logits = naive_run(
            model,
            Strategy.full(num_layers),
            context_ids,
            continuation_ids,
            stepwise=False,
            capture_layers=range(num_layers),
        )
        self.logprobs = torch.log_softmax(logits, dim=-1)


def naive_cell(
    model,
    reference: NaiveReference,
    context_ids,
    continuation_ids,
    layer: int,
    phase: str,
    pattern: str,
    budget: int,
    params=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token ``(cosine, NLL, KL)`` of one cell on one sample (float64 ``[m]`` each), by a full forward."""
    num_layers = len(model_parts.decoder_layers(model))
    strategy = single_layer_strategy(num_layers, layer, phase, pattern, budget, params)
    outputs, nll, logits = naive_run(
        model, strategy, context_ids, continuation_ids, stepwise=phase == "decoding", capture_layers=[layer]
    )
    cos = cosine_per_token(outputs[layer], reference.outputs[layer])[0].cpu()
    kl = token_kl(reference.logprobs, logits[None])[0].cpu()
    return cos, nll, kl
