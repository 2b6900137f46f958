"""Pooled allocation: a pattern whose tokens are ranked over many KV heads at once, so heads keep
different numbers of tokens (``kvzip`` with ``allocation="layer"`` or ``"model"``, KVzip's own rule:
https://arxiv.org/abs/2505.23416).

After the reconstruction pass, :func:`allocate` forms each entry's *pools* in a phase: with ``"model"``
every layer whose plan in that phase uses the same pattern, with ``"layer"`` each such layer alone. A
pool's *cells* are its layers' KV heads, ``P`` of them, and its capacity is ``C = sum_l Hkv * b_l`` (the
same total the per-head rule keeps). Per batch row, every token the cells hold is ranked once by the
pattern's selection key: protected tokens (sinks) first, then the score, padding last; ties go to the
lower layer, then the lower head, then the older token, so that within a cell the order is the one
:func:`~polykv_search.patterns.selection.select_keep` uses. Each layer gets a :class:`PoolShare` holding
those ranks of its own cells, and evicts from them alone, in its own attention call:

- after ``a`` tokens were appended to every cell (the question, the answer; kvzip ranks them above every
  prompt token, the newest first), a cell keeps all ``a`` of them plus its prompt tokens ranked below
  ``K = C - P * a``: the pool's top ``C`` as one ranking (in prefill ``a = 0``);
- once ``K`` falls below the ``S`` protected tokens, a cell keeps its protected tokens and the newest
  ``(C - S) // P`` appended ones (the pool then holds at most ``C``).

A *pool prior* (the layer's pattern's :attr:`~polykv_search.patterns.base.Pattern.prior`: kvzip's ``weight``,
``floor``, ``cap``, one value for the layer or one per KV head) steers the ranking, each cell by its own value: a
cell's scores are multiplied by its weight (in float64, so the order inside a cell is kept); its top
``min(floor, b)`` tokens rank above every other unprotected token of the pool (among themselves by weighted score), so
they stay while the pool holds any prompt token beyond its protected ones (always in prefill) and go before the appended
tokens once these outgrow the pool, as other prompt tokens do; its tokens past its top ``cap`` (protected ones
aside) are never kept. Layers whose patterns differ only by their priors share one pool (``pool_identity``). The
default prior leaves every rank as it was.

The prompt tokens' ranks are fixed after the pass and ``K`` only falls, so every layer finds its counts
without the others. Unlike kvpress, which keeps the question and answer on top of its budget, the pool's
total holds ``C`` through the question call and decoding.

Memory: the runtime builds a pooled layer as one head group per KV head
(:func:`~polykv_search.runtime.layouts.per_head_groups`), each a store of its own length, so the KV bytes
are those of the tokens held. A store of several KV heads (a layer built directly) pads its shorter heads with
invalid slots, and the report's ``kept`` counts real tokens. Limits: ``decode_interval = 1`` only, and no
pooled plan in a head group of several KV heads (:func:`check_plans`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from polykv_search.patterns.selection import NEG_INF, POS_INF

#: The rank of a padding slot: above any real one.
_NEVER = torch.iinfo(torch.long).max


def _counts(ranks, capacity: int, cells: int, protected, appended: int) -> torch.Tensor:
    """Tokens each cell of ``ranks`` ``[B, h, n]`` keeps after ``appended`` tokens (module docstring)."""
    cut = capacity - cells * appended
    cut_rows = torch.clamp(protected, min=cut)  # [B]
    prompt = (ranks < cut_rows[:, None, None]).sum(-1)
    spare = torch.clamp((capacity - protected) // cells, min=0, max=appended)
    kept_appended = torch.where(protected <= cut, appended, spare)
    return prompt + kept_appended[:, None]


@dataclass
class Pool:
    """A whole pool's ranks ``[B, P, n]`` (cells padded with never-kept ranks), so that one call finds every
    cell's count at a step (each layer of the step reads its slice of the same result)."""

    ranks: torch.Tensor
    capacity: int
    protected: torch.Tensor
    seen: int
    memo: tuple[int, torch.Tensor] | None = None

    def counts(self, seen: int) -> torch.Tensor:
        if self.memo is None or self.memo[0] != seen:
            counts = _counts(self.ranks, self.capacity, self.ranks.shape[1], self.protected, seen - self.seen)
            self.memo = (seen, counts)
        return self.memo[1]


@dataclass
class PoolShare:
    """One layer's part of a pool: ``ranks`` ``[B, Hkv, n]`` of the tokens it held when the pool was
    formed (padding: never kept), the pool's ``capacity`` C, ``cells`` P, ``protected`` S per row
    ``[B]``, and ``seen`` then (tokens appended since are counted from it); ``pool`` and ``first`` (its first
    cell there) while the batch rows have not moved."""

    ranks: torch.Tensor
    capacity: int
    cells: int
    protected: torch.Tensor
    seen: int
    pool: Pool | None = None
    first: int = 0

    def counts(self, seen: int) -> torch.Tensor:
        """Tokens each cell keeps ``[B, Hkv]`` once ``seen`` tokens were seen (module docstring)."""
        if self.pool is not None:
            return self.pool.counts(seen)[:, self.first : self.first + self.ranks.shape[1]]
        return _counts(self.ranks, self.capacity, self.cells, self.protected, seen - self.seen)

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Move the batch rows as the layer's own tensors move (beam search, batch selection); the share then
        finds its counts alone."""
        self.ranks, self.protected = fn(self.ranks), fn(self.protected)
        self.pool = None


def _any_pooled(pairs) -> bool:
    return any(plan.evicts and plan.pattern.pooled is not None for pair in pairs for plan in pair)


def check_groups(groups) -> None:
    """Refuse (``ValueError``, one line) a pooled plan in a head group of several KV heads: a pool's cells
    are single KV heads (the runtime gives a pooled layer one group per head)."""
    for g in groups:
        if len(g.heads) > 1 and _any_pooled([(g.prefill, g.decoding)]):
            raise ValueError(
                f"head group {list(g.heads)} uses a pooled allocation (kvzip's allocation='layer' or 'model'); "
                "a pooled plan applies to whole layers or to single-head groups"
            )


def check_plans(plans, groups, decode_interval: int) -> None:
    """Refuse (``ValueError``, one line) what a pooled allocation does not support: ``decode_interval > 1``
    and head groups of several KV heads. ``plans``: ``(prefill, decoding)`` pairs; ``groups``: head groups."""
    check_groups(groups)
    if decode_interval != 1 and _any_pooled(list(plans) + [(g.prefill, g.decoding) for g in groups]):
        raise ValueError(
            "a pooled allocation (kvzip's allocation='layer' or 'model') evicts every decoding step; "
            f"decode_interval must be 1, got {decode_interval}"
        )


def pool_entries(layers: Sequence) -> list[list]:
    """Per entry, its cells' layers in model order (a layer of head groups: its groups' layers, in head
    order), each as ``(cell, the layer's KV heads it holds)`` (None: all of them; a per-head prior picks its
    values by them): a cache's own layers are one entry; the scorer's shared context layers (``rows``) give one
    entry per row."""
    heads = {id(cell): kv for layer in layers for cell, kv in layer.cells()}
    entries = zip(*(layer.entries() for layer in layers))
    return [[(cell, heads.get(id(cell))) for cells in entry for cell in cells] for entry in entries]


def allocate(entries: Sequence[Sequence], phase: str) -> None:
    """Give every layer whose ``phase`` plan uses a pooled pattern its :class:`PoolShare` of that phase. An
    entry's items: :func:`pool_entries`'s ``(cell, KV heads)`` or a cell holding all its layer's KV heads."""
    for items in entries:
        pools: dict = {}
        for item in items:
            layer, heads = item if isinstance(item, tuple) else (item, None)
            plan = layer.plans[phase]
            if not plan.evicts or plan.pattern.pooled is None:
                continue
            identity = plan.pattern.pool_identity()
            key = identity if plan.pattern.pooled == "model" else (identity, layer.layer_idx)
            pools.setdefault(key, []).append((layer, heads))
        for members in pools.values():
            _share(members, phase)


def steered(key: torch.Tensor, prior, budget: int, heads=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One cell's selection keys ``[B, h, n]`` with its pool prior applied, each KV head its own value of it (the
    cell holds its layer's KV ``heads``; None: all of them), and its floor's tokens (a bool mask; None without a
    floor), which the pool ranks above every other unprotected token (module docstring)."""
    weights, floors, caps = prior.per_head(key.shape[1] if heads is None else heads)
    if prior.weighted:
        key = key * (weights[0] if len(set(weights)) == 1 else _column(weights, key))
    first = None
    if any(floors) or any(caps):
        order = torch.sort(key, dim=-1, descending=True, stable=True).indices
        slots = torch.arange(key.shape[-1], device=key.device).expand_as(order)
        place = torch.empty_like(order).scatter_(-1, order, slots)  # each token's place in its KV head's order
        if any(floors):
            limit = _column([min(f, budget) for f in floors], place)
            first = (place < limit) & (key != NEG_INF) & (key != POS_INF)
        if any(caps):
            limit = _column([c or key.shape[-1] for c in caps], place)  # cap 0: that head keeps any number
            key = key.masked_fill((place >= limit) & (key != POS_INF), NEG_INF)
    return key, first


def _column(values, like: torch.Tensor) -> torch.Tensor:
    """Per-KV-head values as ``[1, Hkv, 1]`` in ``like``'s dtype and device."""
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(1, -1, 1)


def _share(cells: Sequence, phase: str) -> None:
    members = [layer for layer, _ in cells]
    plans = [layer.plans[phase] for layer in members]
    weighted = any(plan.pattern.prior.weighted for plan in plans)
    keys, firsts = [], []
    for (layer, heads), plan in zip(cells, plans):
        key = plan.pattern.selection_key(layer, layer._state(plan.pattern), [plan.budget])
        key = key.double() if weighted else key.float()  # float64: a weight never merges a cell's distinct scores
        key, first = steered(key, plan.pattern.prior, plan.budget, heads)
        keys.append(key)
        firsts.append(first)
    rows = keys[0].shape[0]
    flat = torch.cat([key.reshape(rows, -1) for key in keys], dim=1)
    order = torch.sort(flat, dim=1, descending=True, stable=True).indices
    if any(first is not None for first in firsts):  # protected first, then the floors' tokens, then the others
        tier = torch.cat([(k == POS_INF).reshape(rows, -1).long() * 2 for k in keys], dim=1)
        for i, first in enumerate(firsts):
            if first is not None:
                start = sum(k[0].numel() for k in keys[:i])
                tier[:, start : start + first[0].numel()] += first.reshape(rows, -1).long()
        order = order.gather(1, torch.sort(tier.gather(1, order), dim=1, descending=True, stable=True).indices)
    place = torch.arange(flat.shape[1], device=flat.device).expand(rows, -1)
    ranks = torch.empty_like(order).scatter_(1, order, place).masked_fill_(flat == NEG_INF, _NEVER)
    protected = (flat == POS_INF).sum(1)
    capacity = sum(layer.num_kv_heads * layer.plans[phase].budget for layer in members)
    n_cells = sum(layer.num_kv_heads for layer in members)
    longest = max(key.shape[-1] for key in keys)
    padded = ranks.new_full((rows, n_cells, longest), _NEVER)
    pool = Pool(padded, capacity, protected, members[0].seen)
    start = cell = 0
    for layer, key in zip(members, keys):
        size = key[0].numel()
        part = ranks[:, start : start + size].reshape(key.shape)
        padded[:, cell : cell + key.shape[1], : key.shape[-1]] = part
        layer.shares[phase] = PoolShare(part, capacity, n_cells, protected, layer.seen, pool, cell)
        start += size
        cell += key.shape[1]
