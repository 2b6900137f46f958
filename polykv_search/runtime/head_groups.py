"""`HeadGroupLayer`: a layer whose KV heads are split into groups, each with its own store and plans.

A head group (e.g. the retrieval heads that keep everything, and the rest that keep sinks + recent)
is an :class:`~polykv_search.runtime.layer.EvictingLayer` over its own KV heads: a dense
``[B, h_g, n_g, D]`` store of its own length, positions, validity, pattern states and evictions (the
DuoAttention layout, generalised to any number of groups). Attention runs once per group, over the
query heads that map to the group's KV heads (GQA), and the outputs go back in head order. Nothing is
masked or padded across groups, so the KV bytes reported are what the groups hold.

A layer with a single group is not built this way: it is a plain :class:`EvictingLayer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from polykv_search.patterns import make_pattern
from polykv_search.patterns.base import PassInputs
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.eviction import PhasePlan
from polykv_search.runtime.layer import EvictingLayer
from polykv_search.runtime.pooled import check_groups
from polykv_search.runtime.report import LayerReport, layer_report


@dataclass(frozen=True)
class HeadGroupPlan:
    """KV heads ``heads`` of a layer and the ``(prefill, decoding)`` plans they apply together."""

    heads: tuple[int, ...]
    prefill: PhasePlan
    decoding: PhasePlan


class HeadGroupLayer(RuntimeLayer):
    """One layer's cache made of head groups (see the module docstring).

    ``update`` splits the new keys/values by group; the attention function calls
    :meth:`attention_call_grouped`, which runs each group's own ``attention_call`` with its query
    heads. ``keys``/``values`` (what ``update`` returns to the model) are the first group's: only the
    runtime's attention function reads them, and it reads the groups.
    """

    def __init__(self, layer_idx: int, head_groups: Sequence[HeadGroupPlan], *, defer_prefill: bool = False, **kwargs):
        self.head_groups = list(head_groups)
        self.parts: list[EvictingLayer] = []
        super().__init__(layer_idx, **kwargs)
        heads = sorted(h for g in self.head_groups for h in g.heads)
        if heads != list(range(self.num_kv_heads)):
            raise ValueError(
                f"layer {layer_idx}: head groups must cover KV heads 0..{self.num_kv_heads - 1} once each, got "
                f"{[list(g.heads) for g in self.head_groups]}"
            )
        check_groups(self.head_groups)
        sub = {**kwargs, "on_update": None}
        self.parts = [
            EvictingLayer(
                layer_idx, g.prefill, g.decoding, defer_prefill=defer_prefill, **{**sub, "num_kv_heads": len(g.heads)}
            )
            for g in self.head_groups
        ]
        self._kv_index = [torch.tensor(g.heads) for g in self.head_groups]
        gqa = self.groups
        self._q_index = [torch.tensor([h * gqa + i for h in g.heads for i in range(gqa)]) for g in self.head_groups]
        self.is_initialized = True

    # ------------------------------------------------------------------ the cache
    keys = property(lambda self: self.parts[0].keys if self.parts else None, lambda self, t: None)
    values = property(lambda self: self.parts[0].values if self.parts else None, lambda self, t: None)

    @property
    def query_heads(self) -> list[torch.Tensor]:
        """Per group, the indices of its query heads (those of its KV heads, GQA)."""
        return self._q_index

    def reset(self) -> None:
        super().reset()
        for part in self.parts:
            part.reset()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        for part, idx in zip(self.parts, self._kv_index):
            idx = idx.to(key_states.device)
            part.update(key_states.index_select(1, idx), value_states.index_select(1, idx))
        self.device = key_states.device
        self.seen += key_states.shape[-2]
        self._notify_update(kwargs.get("kwargs"))
        return self.keys, self.values

    def thaw(self) -> None:
        for part in self.parts:
            part.thaw()

    # Batch moves (beam search, contrastive search, ``Cache.batch_select_indices``): each group's own
    # layer moves its store, positions, validity and pattern states (the mixin's default would only
    # reassign ``keys``/``values``, which this layer does not own).
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for part in self.parts:
            part.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        for part in self.parts:
            part.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for part in self.parts:
            part.batch_select_indices(indices)

    @property
    def length(self) -> int:
        """The longest group's slots (each group holds its own number of tokens)."""
        return max(part.length for part in self.parts)

    def kv_bytes(self) -> int:
        return sum(part.kv_bytes() for part in self.parts)

    def awaits_pass(self) -> bool:
        return any(part.deferred for part in self.parts)

    def pass_plans(self) -> list[tuple[PhasePlan, PhasePlan]]:
        return [pair for part in self.parts for pair in part.pass_plans()]

    def begin_pass(self, prompt_len: int) -> None:
        for part in self.parts:
            part.begin_pass(prompt_len)

    def end_pass(self) -> None:
        for part in self.parts:
            part.end_pass()

    def finish_deferred(self) -> None:
        for part in self.parts:
            part.finish_deferred()

    # ----------------------------------------------------------------- attention
    def attention_call_grouped(self, query: torch.Tensor, attend, inputs: PassInputs | None = None) -> torch.Tensor:
        """Each group's ``attend(part, query_of_its_heads, inputs_of_its_heads)`` (an ``attention_call`` of the
        group's own layer: hooks, kernel, eviction), outputs ``[B, q, Hq, D]`` put back in query-head order."""
        out: torch.Tensor | None = None
        for part, idx in zip(self.parts, self._q_index):
            idx = idx.to(query.device)
            got = attend(part, query.index_select(1, idx), None if inputs is None else inputs.heads(idx))
            if out is None:
                out = got.new_empty(got.shape[0], got.shape[1], query.shape[1], got.shape[-1])
            out[:, :, idx] = got
        if self.parts[0].pass_prompt is not None:  # a reconstruction call: the groups cut back themselves
            self.seen = self.parts[0].seen
        else:
            self.calls += 1
        assert out is not None  # a layer has at least one group
        return out

    def entries(self) -> list[list[EvictingLayer]]:
        return [list(self.parts)]

    def layer_report(self) -> LayerReport:
        """What the groups hold: bytes summed; tokens and budgets as the mean over KV heads."""
        reports = [layer_report(part) for part in self.parts]
        sizes = [len(g.heads) for g in self.head_groups]

        def mean(values) -> int | None:
            if any(v is None for v in values):
                return None
            return round(sum(v * s for v, s in zip(values, sizes)) / sum(sizes))

        return LayerReport(
            layer=self.layer_idx,
            seen=self.seen,
            kept=round(sum(r.kept * s for r, s in zip(reports, sizes)) / sum(sizes)),
            kv_bytes=sum(r.kv_bytes for r in reports),
            peak_kv_bytes=sum(r.peak_kv_bytes for r in reports),
            full_kv_bytes=sum(r.full_kv_bytes for r in reports),
            prefill_budget=mean([g.prefill.budget for g in self.head_groups]),
            decoding_budget=mean([g.decoding.budget for g in self.head_groups]),
        )


def per_head_groups(prefill: PhasePlan, decoding: PhasePlan, num_kv_heads: int) -> list[HeadGroupPlan] | None:
    """One group per KV head when a plan pools its tokens over heads (kvzip's ``allocation="layer"`` or
    ``"model"``): each head then holds its own number of tokens in a store of its own; else None."""
    if not any(plan.evicts and plan.pattern.pooled is not None for plan in (prefill, decoding)):
        return None
    return [HeadGroupPlan((h,), prefill, decoding) for h in range(num_kv_heads)]


def cache_layer(
    layer_idx: int,
    prefill: PhasePlan,
    decoding: PhasePlan,
    head_groups: Sequence[HeadGroupPlan] | None = None,
    *,
    defer_prefill: bool = False,
    **kwargs,
) -> RuntimeLayer:
    """The cache layer of one layer's plans: a :class:`HeadGroupLayer` of its ``head_groups`` (or of one group
    per KV head, :func:`per_head_groups`), else an :class:`EvictingLayer`."""
    head_groups = head_groups or per_head_groups(prefill, decoding, kwargs["num_kv_heads"])
    if head_groups:
        return HeadGroupLayer(layer_idx, head_groups, defer_prefill=defer_prefill, **kwargs)
    return EvictingLayer(layer_idx, prefill, decoding, defer_prefill=defer_prefill, **kwargs)


def choice_head_groups(prefill, decoding, num_kv_heads: int) -> list[HeadGroupPlan] | None:
    """The head groups of one layer's ``(prefill, decoding)`` strategy choices, or None for a layer-level
    layer. A choice's ``head_groups`` (each with ``heads``, ``pattern``, ``params``, ``budget``) split the
    layer's KV heads; both phases must split them the same way, or one phase not at all (its choice then
    applies to every group)."""

    def plans(choice):
        groups = choice.head_groups
        if not groups:
            return None
        return {tuple(g.heads): PhasePlan(make_pattern(g.pattern, **dict(g.params)), g.budget) for g in groups}

    p, d = plans(prefill), plans(decoding)
    if p is None and d is None:
        return None
    if p is not None and d is not None and set(p) != set(d):
        raise ValueError(
            f"head groups differ between prefill {sorted(p)} and decoding {sorted(d)}: a layer's KV heads are "
            "stored in one split for both phases"
        )

    def whole(choice) -> PhasePlan:
        return PhasePlan(make_pattern(choice.pattern, **dict(choice.params)), choice.budget)

    keys = list(p or d or {})
    return [HeadGroupPlan(h, p[h] if p else whole(prefill), d[h] if d else whole(decoding)) for h in keys]
