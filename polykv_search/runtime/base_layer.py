"""`RuntimeLayer`: what every cache layer of the runtime shares, evicting or composite.

The counters (tokens seen, calls, evictions), the transformers ``CacheLayerMixin`` API and
:meth:`RuntimeLayer.attention_call`, the one place that runs the hook points. The cached tensors the attention
function reads (``keys``/``values`` ``[B, Hkv, n, D]``, ``positions`` and ``valid`` ``[B, Hkv, n]``) are
:class:`~polykv_search.runtime.storage.StoreViews`; the read side patterns use (masks, attention statistics, the
:class:`~polykv_search.patterns.base.LayerView` protocol) is :class:`~polykv_search.runtime.view.ViewOps`, so a
pattern reading a layer during a call never calls back into this module. Subclasses say what a call does:
:meth:`update`, :meth:`begin_call`, :meth:`observers` and :meth:`end_call`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers.cache_utils import CacheLayerMixin

from polykv_search.patterns.base import PassInputs
from polykv_search.runtime.report import LayerReport
from polykv_search.runtime.storage import StoreViews
from polykv_search.runtime.view import ViewOps
from strategies import PHASES

PREFILL, DECODING = PHASES

#: How ``decode_interval = k`` evicts: ``"within"`` keeps every layer at or below its budget (it evicts
#: down to ``budget - k + 1`` once over it); ``"over"`` lets it hold up to ``budget + k - 1`` tokens.
INTERVAL_MODES = ("within", "over")

if TYPE_CHECKING:  # pragma: no cover
    from polykv_search.runtime.fanout import SharedCells
    from polykv_search.runtime.layer import EvictingLayer
    from polykv_search.runtime.row_batch import RowCells


class RuntimeLayer(StoreViews, CacheLayerMixin, ViewOps):
    """Base of the runtime's cache layers (see the module docstring).

    ``get_seq_length`` reports tokens *seen*, so ``generate()`` keeps absolute positions.
    ``on_update(layer, call)`` is called after every ``update`` with the model's ``kwargs`` dict of that call:
    the runtime's writes the layer into it, which the attention function receives (None: a detached layer
    nobody attends through, e.g. a part of a composite). ``rotary``: the
    model's rotary embedding (:class:`~polykv_search.runtime.architectures.ModelRotary`), for patterns
    that need RoPE (None: a layer built without a model; such a pattern then fails loudly). ``mask``:
    ``mask(layer, query_positions)`` replaces :meth:`allowed` (a layout whose rows or heads see other keys
    than their kept ones, e.g. the collector's head cells; None: the kept positions decide). ``watchers``:
    ``(hooks, state)`` observers of every call besides the plans' patterns (e.g. a recorder of queries).
    """

    is_sliding = False
    is_croppable = False

    def __init__(
        self,
        layer_idx: int,
        *,
        num_kv_heads: int,
        groups: int,
        scaling: float,
        sliding_window: int | None = None,
        decode_interval: int = 1,
        interval_mode: str = "within",
        on_update=None,
        rotary=None,
        mask=None,
        watchers=(),
    ):
        super().__init__()
        if interval_mode not in INTERVAL_MODES:
            raise ValueError(f"interval_mode must be one of {INTERVAL_MODES}, got {interval_mode!r}")
        self.layer_idx = layer_idx
        self.num_kv_heads = num_kv_heads
        self.groups = groups
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.decode_interval = decode_interval
        self.interval_mode = interval_mode
        self._on_update = on_update
        self.rotary = rotary
        self.mask = mask
        self.watchers = list(watchers)
        self.reset()

    def _notify_update(self, call: dict | None) -> None:
        """Hand this layer to the attention call that follows (``call``: the ``kwargs`` dict the model gave
        ``cache.update``, None when a composite layer updates its parts) through ``on_update``."""
        if self._on_update is not None:
            self._on_update(self, call)

    # ------------------------------------------------------- CacheLayerMixin API
    def reset(self) -> None:
        self._keys = self._values = self._positions = self._valid = None
        self._store = None
        self.counts = None
        self._all_valid = True
        self.is_initialized = False
        self.seen = 0
        self.calls = 0
        self.num_evictions = 0
        self.steps_since_eviction = 0
        self.peak_length = 0
        self.query_range = range(0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} is built initialized")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        raise NotImplementedError

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "an evicting cache cannot be cropped (assisted/speculative decoding is not supported)"
        )

    # Batch moves (beam search, contrastive search, ``Cache.batch_select_indices``): the store, positions,
    # validity and pattern states move together (the mixin's default would only reassign ``keys``/``values``).
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices])

    def _map_batch(self, fn) -> None:
        """Apply ``fn`` to every tensor of this layer that has one entry per batch row."""
        raise RuntimeError(f"polykv-search: a {type(self).__name__} cannot move its batch rows")

    #: The prompt length while a reconstruction pass runs (its calls feed :meth:`observe_pass`), else None.
    pass_prompt: int | None = None

    @property
    def ragged(self) -> bool:
        """True when the KV heads of a row hold different numbers of tokens (a pooled allocation)."""
        return False

    def observers(self) -> list:
        """``(hooks, state)`` pairs whose ``pre_kernel``/``post_kernel`` watch this (non-pass) call."""
        return []

    def attention_call_grouped(self, query: torch.Tensor, attend, inputs: PassInputs | None = None) -> torch.Tensor:
        """This layer's attention call on ``query`` ``[B, Hq, q, D]``: ``attend(layer, query, inputs)`` runs one
        kernel over one layer's store (hooks, kernel, eviction; ``inputs``: the reconstruction pass's
        :class:`~polykv_search.patterns.base.PassInputs` of this call, or None). A layer made of parts (head
        groups, row parts) runs one per part, each with its share of ``query`` and ``inputs``, and puts the
        outputs ``[B, q, Hq, D]`` back in order."""
        return attend(self, query, inputs)

    def write_back(self) -> None:
        """Hand the rows this layer decoded back to their own layers (a layer of rows); a row's own layer,
        decoded alone, is detached again (it no longer hands itself to attention calls)."""
        self._on_update = None

    # The reconstruction pass and pooled allocations reach a layer's *cells*: the evicting layers it is made of.
    def cells(self) -> list[tuple[EvictingLayer, tuple[int, ...] | None]]:
        """This layer's cells, each with the KV heads of this layer it holds (None: all of them): itself, its
        head groups' layers, or none (a decoding batch of rows, which no pass or pool reaches)."""
        return []

    def as_row(self) -> EvictingLayer | None:
        """This layer as one row of a row batch (:func:`~polykv_search.runtime.layouts.row_batch`): itself
        when it is one store whose KV heads hold equally many tokens, else None."""
        return None

    def entries(self) -> list[list[EvictingLayer]]:
        """Per entry (a cache's own layers: one; the scorer's shared context layers: one per row), the
        evicting layers whose KV heads a pooled allocation ranks (:func:`~polykv_search.runtime.pooled.allocate`)."""
        return [[cell for cell, _ in self.cells()]]

    def layer_report(self) -> LayerReport:
        """What this layer holds now (:func:`~polykv_search.runtime.report.layer_report`)."""
        raise NotImplementedError

    def observe_pass(self, query: torch.Tensor, lse: torch.Tensor | None, inputs: PassInputs | None = None) -> None:
        """A reconstruction-pass call: hand ``query``, the kernel's log-sum-exp ``lse`` (None: none) and the
        attention module's ``inputs`` (None: the pass handed none, as no pattern needs them) to the model-level
        patterns' ``reconstruct``."""
        raise RuntimeError(f"polykv-search: a {type(self).__name__} takes no part in a reconstruction pass")

    def awaits_pass(self) -> bool:
        """True while a cell's prefill eviction waits for a reconstruction pass (see ``EvictingLayer``)."""
        return any(cell.deferred for cell, _ in self.cells())

    def pass_plans(self) -> list:
        """The ``(prefill, decoding)`` plans a reconstruction pass of this layer serves (the deferred cells')."""
        return [(cell.plans[PREFILL], cell.plans[DECODING]) for cell, _ in self.cells() if cell.deferred]

    def begin_pass(self, prompt_len: int) -> None:
        """Enter a reconstruction pass over the ``prompt_len`` cached prompt tokens (a layer with a store of
        the whole prompt, or of stores that are)."""
        raise RuntimeError(f"polykv-search: a {type(self).__name__} takes no part in a reconstruction pass")

    def end_pass(self) -> None:
        """Leave the reconstruction pass."""

    def finish_deferred(self) -> None:
        """Run the prefill eviction a deferred prefill call skipped (after the reconstruction pass)."""
        for cell, _ in self.cells():
            cell.finish_deferred()

    def begin_call(self, q_len: int, padding_mask: torch.Tensor | None) -> None:
        raise NotImplementedError

    def end_call(self) -> None:
        raise NotImplementedError

    def attend(self, query: torch.Tensor, inputs: PassInputs | None, riders=None, *, kernel, scaling: float, padding):
        """One attention call over this layer's store (:meth:`attention_call`, ``riders`` its cells that run no
        kernel) whose kernel is ``kernel(query, keys, values, mask, scaling, is_causal=, lse=)`` (the model's,
        :func:`~polykv_search.runtime.view.run`) with this layer's own mask; ``padding``: the model's 2-D padding
        mask (None: none). The attention function hands it, bound to ``kernel``, ``scaling`` and ``padding``, to
        :meth:`attention_call_grouped`."""
        q_len = query.shape[-2]

        def run():
            mask, is_causal = self.kernel_mask(q_len)
            lse = self.pass_prompt is not None  # a reconstruction call: the patterns read the log-sum-exp
            return kernel(query, self.keys, self.values, mask, scaling, is_causal=is_causal, lse=lse)

        return self.attention_call(query, _align_padding(padding, self.seen, q_len), run, inputs=inputs, riders=riders)

    def attention_call(
        self,
        query: torch.Tensor,
        padding_mask: torch.Tensor | None,
        kernel=None,
        *,
        finish: bool = True,
        inputs: PassInputs | None = None,
        riders: SharedCells | RowCells | None = None,
    ):
        """Run one attention call of this layer: :meth:`begin_call`, the observers' ``pre_kernel``,
        ``kernel()`` (``None``: no kernel, e.g. a replay of recorded queries; it returns the output, or the
        output and its log-sum-exp ``[B, Hq, q]`` or None), their ``post_kernel`` (in a reconstruction pass
        first :meth:`observe_pass` with that log-sum-exp and the pass's ``inputs``), then :meth:`end_call`
        (``finish=False`` stops before it). ``riders``: cells that share this store and its calls without a
        kernel of their own (:class:`~polykv_search.runtime.fanout.SharedCells`), begun, observed (the
        log-sum-exp of a pass included) and ended with it. Returns the kernel's output."""
        passing = self.pass_prompt is not None
        self.begin_call(query.shape[-2], padding_mask)
        observers = self.observers()
        if self.watchers:
            observers = [*observers, *self.watchers]
        if riders is not None:
            riders.begin_call(query.shape[-2], padding_mask, passing)
            observers = [*observers, *riders.observers(passing)]
        # what patterns observe is not differentiable, and no state they keep may hold the graph
        observed = query.detach() if query.requires_grad else query
        with torch.no_grad():
            for hooks, state in observers:
                hooks.pre_kernel(self, state, observed)
        out = None if kernel is None else kernel()
        out, lse = out if isinstance(out, tuple) else (out, None)
        with torch.no_grad():
            if passing:
                self.observe_pass(observed, lse, inputs)
                if riders is not None:
                    riders.observe_pass(self, observed, lse, inputs)
            for hooks, state in observers:
                hooks.post_kernel(self, state, observed)
        if finish:
            if riders is not None:
                riders.end_call(passing)
            self.end_call()
        return out

    def thaw(self) -> None:
        """Replace what this layer holds that was made inside ``torch.inference_mode`` by normal copies, so
        that a forward outside it may append and evict (see
        :meth:`~polykv_search.runtime.runtime.PolyKVCache.prepare_forward`). The layers a strategy's cache
        holds implement it; the composite layers of the scoring engine, which runs every forward in one
        mode, refuse."""
        raise RuntimeError(
            f"polykv-search: a {type(self).__name__} made inside torch.inference_mode cannot be used outside "
            "it; run its forwards in one mode"
        )


def _align_padding(padding: torch.Tensor | None, seen: int, q_len: int) -> torch.Tensor | None:
    """Return a padding mask indexed by sequence position, accepting full-length or call-length masks."""
    if padding is None:
        return None
    if padding.shape[-1] == seen:
        return padding
    if padding.shape[-1] == q_len:
        return F.pad(padding, (seen - q_len, 0), value=True)
    raise ValueError(
        f"attention_mask has length {padding.shape[-1]}, expected {seen} (all tokens so far) or {q_len} (this call)"
    )
