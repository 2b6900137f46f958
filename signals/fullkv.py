"""The FullKV pass: one per calibration sample; it records everything the replay needs.

With a Full strategy applied, the context (n tokens) and then the continuation (m tokens, one call)
run through the model's own modules layer by layer. Recorded per layer: the prompt's K/V cache (what
every layer holds after prefill), the prompt's post-RoPE queries (what patterns' ``pre_kernel`` /
``post_kernel`` hooks see during prefill), and the hidden states entering each layer on the
continuation; plus the FullKV per-token NLL and next-token log-probabilities of the continuation
(for ΔPPL and KL) and the attention entropy/variance
of every (layer, phase). Queries are captured by a cache layer that adds one observer to the hook
points (a :class:`QueryRecorder` among the layer's ``watchers``) — the runtime's documented extension point,
no forward code copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from polykv_search.runtime import FULL_PLAN, EvictingLayer, PolyKVCache
from signals import entropy as entropy_mod
from signals import model_parts
from signals.ppl import token_nll
from strategies import PHASES


class QueryRecorder:
    """A watcher on the hook points (a layer's ``watchers``) that keeps every call's post-RoPE queries."""

    def __init__(self) -> None:
        self.queries: list[torch.Tensor] = []

    def pre_kernel(self, layer, state, query) -> None:
        self.queries.append(query)

    def post_kernel(self, layer, state, query) -> None:
        pass


def recording_layer(runtime, layer_idx: int) -> tuple[EvictingLayer, QueryRecorder]:
    """A FullKV cache layer that also records the queries of each attention call, and its recorder."""
    recorder = QueryRecorder()
    layer = EvictingLayer(
        layer_idx, FULL_PLAN, FULL_PLAN, watchers=[(recorder, None)], **runtime.layer_kwargs(layer_idx)
    )
    return layer, recorder


@dataclass
class FullKVRecord:
    """What one sample's FullKV pass leaves for the replay (tensors on the model's device)."""

    context_len: int
    continuation: torch.Tensor  #: continuation ids ``[m]``
    keys: list[torch.Tensor]  #: per layer, prompt keys ``[1, Hkv, n, D]`` (post-RoPE)
    values: list[torch.Tensor]  #: per layer, prompt values
    queries: list[torch.Tensor]  #: per layer, prompt queries ``[1, Hq, n, D]`` (post-RoPE)
    hidden: list[torch.Tensor]  #: L+1 entries ``[1, m, d]``: input of layer j; [L] = last layer's output
    nll: torch.Tensor  #: float64 ``[m]``: FullKV NLL of x_0..x_{m-1}
    logprobs: torch.Tensor  #: ``[m-1, V]`` FullKV next-token log-probabilities at positions 0..m-2
    entropy: dict[str, list[float]] = field(default_factory=dict)  #: phase → per layer
    variance: dict[str, list[float]] = field(default_factory=dict)
    #: model-level pattern → its per-layer state after the reconstruction pass (:mod:`signals.reconstruction`)
    reconstruction: dict = field(default_factory=dict)

    @property
    def continuation_len(self) -> int:
        return int(self.continuation.shape[0])

    @property
    def mean_nll(self) -> float:
        return float(self.nll.mean())

    def position_ids(self, device) -> torch.Tensor:
        n = self.context_len
        return model_parts.positions(n, n + self.continuation_len, device)


@torch.no_grad()
def full_kv_pass(model, runtime, context_ids, continuation_ids, *, phases=PHASES, stats=True) -> FullKVRecord:
    """Run one sample under FullKV (``runtime``: an applied Full strategy) and record it."""
    device = next(model.parameters()).device
    ctx = torch.as_tensor(context_ids, dtype=torch.long, device=device)
    cont = torch.as_tensor(continuation_ids, dtype=torch.long, device=device)
    n, m = int(ctx.shape[0]), int(cont.shape[0])
    num_layers = len(model_parts.decoder_layers(model))
    layers, recorders = zip(*(recording_layer(runtime, j) for j in range(num_layers)))
    cache = PolyKVCache(layers)

    hidden = model_parts.embed(model, ctx[None])
    pos = model_parts.positions(0, n, device)
    pe = model_parts.rotary(model, hidden, pos)
    for j in range(num_layers):
        hidden = model_parts.run_layer(model, j, hidden, pe, pos, cache)
    first_nll = token_nll(model_parts.logits(model, hidden[:, -1:]), cont[:1])[0]
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    queries = [recorder.queries[0] for recorder in recorders]

    hidden = model_parts.embed(model, cont[None])
    pos = model_parts.positions(n, n + m, device)
    pe = model_parts.rotary(model, hidden, pos)
    inputs = [hidden]
    for j in range(num_layers):
        hidden = model_parts.run_layer(model, j, hidden, pe, pos, cache)
        inputs.append(hidden)
    logits = model_parts.logits(model, hidden[0, :-1])  # [m-1, V]
    rest = token_nll(logits[None], cont[1:])[0] if m > 1 else first_nll[:0]
    record = FullKVRecord(
        context_len=n,
        continuation=cont,
        keys=keys,
        values=values,
        queries=queries,
        hidden=inputs,
        nll=torch.cat([first_nll, rest]).cpu(),
        logprobs=torch.log_softmax(logits.float(), dim=-1),
    )
    if stats:
        with model_parts.cpu_threads(
            model_parts.SMALL_OP_THREADS
        ):  # memory-bound: one thread is as fast, and robust under load
            _stats(record, cache, recorders, phases, n, m, device)
    return record


def _stats(record: FullKVRecord, cache, recorders, phases, n: int, m: int, device) -> None:
    prompt_pos = torch.arange(n, device=device)
    cont_pos = torch.arange(n, n + m, device=device)
    for phase in phases:
        ent, var = [], []
        for layer, recorder in zip(cache.layers, recorders):
            q, p = (recorder.queries[0], prompt_pos) if phase == "prefill" else (recorder.queries[1], cont_pos)
            e, v = entropy_mod.phase_stats(layer, q, p, phase)
            ent.append(e)
            var.append(v)
        record.entropy[phase], record.variance[phase] = ent, var
