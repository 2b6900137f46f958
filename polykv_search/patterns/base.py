"""The pattern–layer contract: what a pattern may read of a layer, its state, and its hook points.

A pattern is a small frozen dataclass holding its parameters. It reads the layer only through
:class:`LayerView` and remembers what it needs in a :class:`~polykv_search.patterns.state.PatternState`
(token-aligned, per-row and shared tensors, moved with the cache by the runtime).

Hook points, called by the runtime in this order for every attention call of a layer:

``pre_kernel(layer, state, query)``
    Post-RoPE queries of this call are visible; this call's keys/values are already appended.
``post_kernel(layer, state, query)``
    After the attention kernel: compute the attention statistics the pattern needs.
``cache_update(layer, state, budget) -> keep``
    Only when the layer must shrink: return the indices ``[batch, kv_heads, budget]`` to keep.

A *model-level* pattern (``model_level = True``, e.g. ``kvzip``) scores the prompt from a pass of the
whole model over it: it declares ``chunk_size`` (prompt tokens per pass call) and
``reconstruct(layer, state, query, prompt_len, lse, inputs)``, which the runtime calls for each attention
call of that pass with the kernel's log-sum-exp (or None) as an argument; a pattern whose
``needs_pass_inputs`` is True also needs ``inputs`` (:class:`PassInputs`: what the attention module saw
beyond its queries, e.g. for KVzip+'s normalization).

``cache_update_rows`` is ``cache_update``'s batched variant for a right-padded batch of rows with a
budget each (the scorer decodes many entries as one batch). Every pattern has one: the default ranks
by :meth:`Pattern.selection_key` exactly as ``cache_update`` does, and a pattern that overrides
``cache_update`` alone gets one that calls its ``cache_update`` once per distinct budget, so the
two can never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import torch

from polykv_search.patterns.selection import (  # noqa: F401  (re-exported: the historical home)
    NEG_INF,
    POS_INF,
    keep_per_row,
    protected_ends,
    select_keep,
    sinks_and_recent,
    valid_rank,
)
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class PassInputs:
    """What one attention call of the reconstruction pass saw beyond its queries, for a model-level pattern
    whose ``needs_pass_inputs`` is True (KVzip+ weighs attention by them).

    Attributes
    ----------
    hidden_norm : torch.Tensor
        ``[B, q]``: the L2 norm of the attention module's input hidden state at each of this call's queries
        (after the decoder layer's input norm: what the query, key and value projections read).
    out_proj : torch.Tensor
        ``[Hq, Dv, hidden]``: each query head's block of the output projection (``o_proj.weight.T`` viewed
        per head, in the model's query-head order), so that head ``j`` writes ``v @ out_proj[j]``.
    """

    hidden_norm: torch.Tensor
    out_proj: torch.Tensor

    def heads(self, index: torch.Tensor) -> PassInputs:
        """The inputs of the query heads ``index`` (long ``[hq]``): a head group's share of its layer's."""
        return PassInputs(self.hidden_norm, self.out_proj.index_select(0, index.to(self.out_proj.device)))


class LayerView(Protocol):
    """Everything a pattern may read of a layer's cache (the runtime's layers and row views implement it).

    Shapes: ``B`` batch rows, ``Hkv`` KV heads, ``Hq`` query heads, ``n`` cached tokens, ``D`` head size.
    """

    #: Index of the layer in the model (seeds, per-layer choices).
    layer_idx: int
    #: KV heads ``Hkv``; ``Hq = Hkv * groups``.
    num_kv_heads: int
    #: The attention kernel's softmax scale (logits are ``scaling * q . k``).
    scaling: float
    #: The layer's sliding window in tokens (a query at ``p`` sees keys ``> p - sliding_window``), or None.
    sliding_window: int | None
    #: Sequence positions of the attention call in progress (this call's queries).
    query_range: range

    @property
    def keys(self) -> torch.Tensor:
        """Cached post-RoPE keys ``[B, Hkv, n, D]``."""

    @property
    def values(self) -> torch.Tensor:
        """Cached values ``[B, Hkv, n, Dv]``."""

    @property
    def valid(self) -> torch.Tensor:
        """Bool ``[B, Hkv, n]``: real tokens (False: padding, never kept ahead of a real token)."""

    @property
    def positions(self) -> torch.Tensor:
        """Long ``[B, Hkv, n]``: the sequence position each slot holds (ascending in every row and head)."""

    #: Tokens seen so far (the positions ``0 .. seen - 1``; this call's included).
    seen: int

    @property
    def all_valid(self) -> bool:
        """True when no slot is padding (fast paths may then skip the masks)."""

    @property
    def length(self) -> int:
        """``n``, the slots held per row and head (the tokens kept, plus padding)."""

    @property
    def num_evictions(self) -> int:
        """Evictions so far (seeded draws depend on it)."""

    def allowed(self, query_positions: torch.Tensor | range) -> torch.Tensor:
        """Bool mask broadcastable to ``[B, Hkv, q, n]``: which cached slots each query (at
        ``query_positions``) may attend to, as the model's kernel masks them."""

    def row_counts(self) -> torch.Tensor | None:
        """Tokens each row holds ``[B]`` (long) when the rows are stored compactly (row ``e``'s tokens in
        slots ``0..count-1`` of every head, the rest padding), else None."""

    def query_valid(self, q_len: int) -> torch.Tensor | None:
        """Which of this call's ``q_len`` queries are real ``[B, q]``, or None when all are."""

    def visible_prefix(self, max_query_position: int) -> int:
        """How many leading cached slots a query at ``max_query_position`` (or before) may see."""

    def attention_probs(
        self, query: torch.Tensor, query_positions: torch.Tensor | range, upto: int | None = None
    ) -> torch.Tensor:
        """Exact softmax attention ``[B, Hq, q, n]`` (fp32) of ``query`` over the cached keys, masked as
        the model's kernel masks them (``upto``: only the first ``upto`` slots)."""

    def rotary_cos_sin(self, positions: torch.Tensor | range) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own RoPE at sequence ``positions``: ``(cos, sin)``, each ``[len(positions), D]``
        fp32, such that the model rotates a query or key ``x`` at position ``p`` as
        ``x * cos[p] + rotate_half(x) * sin[p]`` (``rotate_half(x) = cat(-x[D/2:], x[:D/2])``; the RoPE
        type's attention scaling included). Positions are sequence indices (tokens seen, padding
        included), the ones ``query_range`` and the cache hold; under ``generate()`` a left-padded row's
        real RoPE positions are these minus its padding, a constant shift per row, which every use that
        un-rotates and re-rotates by the same positions cancels. Raises ``RuntimeError`` on a layer
        built without a model (wired by ``PolyKVRuntime.layer_kwargs``)."""

    def repeat_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, Hkv, ...]`` to query heads ``[B, Hq, ...]``."""

    def group_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, Hq, ...]`` to KV heads ``[B, Hkv, ...]``, summing each GQA group."""

    def group_mean(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, Hq, ...]`` to KV heads ``[B, Hkv, ...]``, averaging each GQA group."""


@dataclass(frozen=True)
class PoolPrior:
    """A static prior on one layer's cells in a pool's ranking (:mod:`polykv_search.runtime.pooled`): its
    scores enter the ranking multiplied by ``weight``; each of its KV heads' top ``min(floor, budget)`` tokens rank
    above the pool's other unprotected tokens (so they are kept after prefill), and it keeps at most its top ``cap``
    prompt tokens (0: no cap; protected tokens whatever the cap). Each is one value for the layer or a tuple with one
    value per KV head (:meth:`per_head`). The default changes nothing."""

    weight: float | tuple[float, ...] = 1.0
    floor: int | tuple[int, ...] = 0
    cap: int | tuple[int, ...] = 0

    @property
    def plain(self) -> bool:
        weights, floors, caps = self.per_head(None)
        return not self.weighted and not any(floors) and not any(caps)

    @property
    def weighted(self) -> bool:
        """True when some KV head's scores are multiplied by a weight other than 1."""
        return any(w != 1.0 for w in _values(self.weight))

    def per_head(self, heads: int | Sequence[int] | None) -> tuple[tuple, tuple, tuple]:
        """``(weights, floors, caps)``, one value per KV head: of a layer of ``heads`` KV heads (an int), or of the
        layer's KV heads ``heads`` (a sequence: a head group's, each value picked by its index); ``ValueError``, one
        line, when a per-head tuple does not hold them. With ``heads`` None, each as given (a scalar as a 1-tuple)."""
        out = []
        for name in ("weight", "floor", "cap"):
            values = _values(getattr(self, name))
            picked = range(heads) if isinstance(heads, int) else heads
            if picked is not None and len(values) == 1:
                values = values * len(picked)
            elif picked is not None:
                if (isinstance(heads, int) and len(values) != heads) or max(picked, default=0) >= len(values):
                    raise ValueError(
                        f"the pool prior's {name} has {len(values)} values, one per KV head, but the layer has "
                        f"KV heads {list(picked)}"
                    )
                values = tuple(values[h] for h in picked)
            out.append(values)
        return tuple(out)  # type: ignore[return-value]


def _values(value) -> tuple:
    return tuple(value) if isinstance(value, tuple) else (value,)


@dataclass(frozen=True)
class Pattern:
    """Base class of every eviction pattern (see the module docstring for the contract)."""

    name: ClassVar[str] = ""
    #: True when the pattern never evicts (``full``).
    keeps_all: ClassVar[bool] = False
    #: True when scoring rows as one padded batch gives each row's own scores (false for seeded draws).
    batch_exact: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "cache_update" in cls.__dict__ and "cache_update_rows" not in cls.__dict__:
            cls.cache_update_rows = Pattern._rows_by_cache_update  # type: ignore[method-assign]

    #: True for a *model-level* pattern (``kvzip``): its prefill eviction needs a pass of the whole model
    #: over the cached prompt first. It declares :attr:`chunk_size` and :meth:`reconstruct`; the runtime
    #: defers every layer's prefill eviction, runs that pass (:mod:`polykv_search.runtime.reconstruction`)
    #: and calls ``reconstruct`` for each attention call of it, instead of the other hook points.
    model_level: ClassVar[bool] = False

    @property
    def pooled(self) -> str | None:
        """``"layer"`` or ``"model"`` for a pattern whose tokens are ranked over all the KV heads of a layer or
        of every layer using it, so that heads keep different numbers of tokens (``kvzip``'s ``allocation``;
        :mod:`polykv_search.runtime.pooled`); None: every KV head keeps its own top-``b``."""
        return None

    @property
    def prior(self) -> PoolPrior:
        """This layer's prior in its pool (kvzip's ``weight``, ``floor``, ``cap``); the default changes nothing."""
        return PoolPrior()

    def pool_identity(self) -> Pattern:
        """The pattern without its :attr:`prior`: layers whose pooled patterns have the same identity share one
        ``"model"`` pool, whatever their priors."""
        return self

    def alone(self) -> Pattern:
        """The pattern as one KV head runs it when it is the only cell of its pool (a head cell of
        :mod:`signals.head_cells`): itself, unless it is pooled, when it is its per-head variant (a pool of
        one cell keeps that cell's own top ``b`` by the same key)."""
        return self

    # -------------------------------------------------------------- hook points
    def pre_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        """Called before the kernel with this call's post-RoPE queries ``[B, Hq, q, D]``."""

    def post_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        """Called after the kernel; accumulate attention statistics here."""

    def cache_update(self, layer: LayerView, state: PatternState, budget: int) -> torch.Tensor:
        """Indices ``[B, Hkv, budget]`` (ascending) of the cached tokens to keep."""
        return select_keep(self.selection_key(layer, state, [budget]), None, None, budget)

    def cache_update_rows(
        self, layer: LayerView, state: PatternState, rows: Sequence[int], budgets: Sequence[int], counts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cache_update`` for a right-padded batch: row ``rows[e]`` of ``layer`` (its real tokens in
        slots ``0..counts[e]-1``) keeps ``budgets[e]`` tokens, exactly those ``cache_update`` keeps for it
        alone. Returns ``keep`` ``[E, Hkv, max(budgets)]`` and ``kept`` ``[E, 1, max(budgets)]`` (False:
        an entry past the row's budget) as :func:`~polykv_search.patterns.selection.keep_per_row`."""
        return keep_per_row(self.selection_key(layer, state, budgets, rows), budgets, counts)

    # ------------------------------------------------ model-level patterns only
    @property
    def chunk_size(self) -> int | None:
        """Prompt tokens one call of the reconstruction pass repeats (None: not a model-level pattern)."""
        return None

    @property
    def needs_pass_inputs(self) -> bool:
        """True when :meth:`reconstruct` needs its ``inputs`` (:class:`PassInputs`), e.g. KVzip+."""
        return False

    def reconstruct(
        self,
        layer: LayerView,
        state: PatternState,
        query: torch.Tensor,
        prompt_len: int,
        lse: torch.Tensor | None,
        inputs: PassInputs | None = None,
    ) -> None:
        """One attention call of the reconstruction pass: ``query`` ``[B, Hq, q, D]`` are the pass's
        queries, the layer holds the prompt's ``prompt_len`` tokens then the pass's own so far; ``lse``
        ``[B, Hq, q]`` is the log-sum-exp the attention kernel computed for these queries over the whole
        cache (None: the kernel gave none; recompute the softmax through ``layer.attention_probs``);
        ``inputs``: what the attention module saw beyond its queries (None: not handed over; a pattern
        whose ``needs_pass_inputs`` is True then refuses)."""
        raise NotImplementedError(f"{self.name} is not a model-level pattern")

    # ---------------------------------------------------------- building blocks
    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        """Importance ``[B, Hkv, n]`` of every cached token (higher is kept first)."""
        raise NotImplementedError

    def protected(self, layer: LayerView, budget: int) -> torch.Tensor | None:
        """Bool ``[B, Hkv, n]``: tokens kept regardless of score (sinks, recent window); None: none."""
        return None

    def selection_key(
        self, layer: LayerView, state: PatternState, budgets: Sequence[int], rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Keys ``[E, Hkv, n]`` whose stable top-``budgets[e]`` is row ``rows[e]``'s kept set: the score,
        protected tokens (at each row's own budget) at +inf, padding at -inf. ``rows=None``: every row,
        with ``budgets`` one entry for all of them or one per row."""
        score = self.score(layer, state).float()
        sel = None if rows is None else torch.tensor(list(rows), device=score.device)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t if sel is None else t.index_select(0, sel)

        distinct = sorted(set(budgets))
        per_row = torch.tensor(list(budgets), device=score.device) if len(distinct) > 1 else None
        protected = None
        for b in distinct:
            mask = self.protected(layer, b)
            if mask is None:
                continue
            mask = take(mask.expand(score.shape))
            if per_row is not None:
                mask = mask & (per_row == b)[:, None, None]
            protected = mask if protected is None else protected | mask
        key = take(score)
        if protected is not None:
            key = key.masked_fill(protected, POS_INF)
        if not layer.all_valid:
            key = key.masked_fill(~take(layer.valid), NEG_INF)
        return key

    def _rows_by_cache_update(self, layer, state, rows, budgets, counts):
        """The batched variant of a pattern that overrides ``cache_update`` alone: one call per distinct
        budget on the whole batch, each row taking its own budget's selection (rows are independent
        when ``batch_exact``)."""
        m = max(budgets)
        keep = torch.zeros(len(rows), layer.num_kv_heads, m, dtype=torch.long, device=layer.keys.device)
        for b in sorted(set(budgets)):
            chosen = self.cache_update(layer, state, b)  # [B, Hkv, b]
            for e, (r, rb) in enumerate(zip(rows, budgets)):
                if rb == b:
                    keep[e, :, :b] = chosen[r]
        slot = torch.arange(m, device=keep.device)
        kept = slot[None, None, :] < torch.tensor(list(budgets), device=keep.device)[:, None, None]
        return keep, kept

    # ------------------------------------------------------------------ utility
    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
