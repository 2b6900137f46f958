"""`apply_strategy`: run a loaded HF causal LM with per-layer, per-phase eviction.

>>> with apply_strategy(model, strategy) as rt:            # doctest: +SKIP
...     out = model.generate(**inputs, max_new_tokens=32)
...     print(rt.report().table())

Integration points (all public transformers APIs): the ``polykv`` attention and mask functions
(``AttentionInterface`` / ``AttentionMaskInterface``), a ``Cache`` made of :class:`EvictingLayer`
(``transformers.cache_utils``), and a forward pre-hook that hands the model a fresh evicting cache
whenever it would otherwise create a ``DynamicCache``. Nothing in the model's forward is copied or
patched; leaving the context restores the attention implementation and removes the hook.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache, DynamicCache

from polykv_search.patterns import make_pattern
from polykv_search.runtime import attention as attn
from polykv_search.runtime.architectures import ModelSpec, model_spec
from polykv_search.runtime.base_layer import RuntimeLayer
from polykv_search.runtime.layer import FULL_PLAN, INTERVAL_MODES, PhasePlan
from polykv_search.runtime.layouts import HeadGroupPlan, cache_layer
from polykv_search.runtime.pooled import check_plans
from polykv_search.runtime.reconstruction import ReconstructionInputs, chunk_size, needs_pass, run_pass
from polykv_search.runtime.report import CacheReport, cache_report
from strategies import Strategy


def choice_plan(choice) -> PhasePlan:
    """The plan of one strategy choice, or of one of its head groups (``pattern``, ``params``, ``budget``)."""
    return PhasePlan(make_pattern(choice.pattern, **dict(choice.params)), choice.budget)


def strategy_plans(strategy: Strategy) -> list[tuple[PhasePlan, PhasePlan]]:
    """The (prefill, decoding) plan of every layer of ``strategy``; a layer split into head groups gets
    ``FULL_PLAN`` here (its groups' plans are :func:`strategy_head_groups`'s)."""

    def plan(choice) -> PhasePlan:
        return FULL_PLAN if choice.head_groups is not None else choice_plan(choice)

    return [(plan(p), plan(d)) for p, d in zip(strategy.prefill, strategy.decoding)]


def strategy_head_groups(strategy: Strategy, num_kv_heads: int) -> dict[int, list[HeadGroupPlan]]:
    """The layers of ``strategy`` split into head groups, with their groups' plans. A choice's ``head_groups``
    split the layer's KV heads; both phases must split them the same way, or one phase not at all (its choice
    then applies to every group)."""

    def plans(choice) -> dict[tuple[int, ...], PhasePlan] | None:
        return {tuple(g.heads): choice_plan(g) for g in choice.head_groups} if choice.head_groups else None

    out = {}
    for i, (prefill, decoding) in enumerate(zip(strategy.prefill, strategy.decoding)):
        p, d = plans(prefill), plans(decoding)
        if p is not None and d is not None and set(p) != set(d):
            raise ValueError(
                f"head groups differ between prefill {sorted(p)} and decoding {sorted(d)}: a layer's KV heads are "
                "stored in one split for both phases"
            )
        if p is not None or d is not None:
            heads = list(p or d or {})
            out[i] = [
                HeadGroupPlan(h, p[h] if p else choice_plan(prefill), d[h] if d else choice_plan(decoding))
                for h in heads
            ]
    return out


class PolyKVCache(Cache):
    """A transformers ``Cache`` whose layers evict to their strategy's budgets."""

    layers: list[RuntimeLayer]  # type: ignore[assignment]  # only the runtime's layers

    def __init__(self, layers: Sequence[RuntimeLayer]):
        super().__init__(layers=[*layers])
        #: The first forward's ``input_ids`` / ``attention_mask`` (the prompt a reconstruction pass repeats).
        self.prompt_ids: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None

    #: True once a forward ran inside ``torch.inference_mode`` (its layers then hold inference tensors).
    holds_inference: bool = False

    def prepare_forward(self) -> None:
        """Called before every forward: a cache written inside ``torch.inference_mode`` holds inference
        tensors, which no op outside it may update in place. The first forward outside it (e.g.
        ``generate()``, which runs under ``no_grad``, after a prefill inside it) copies them into normal
        tensors once; ``DynamicCache``, which appends by concatenation, never needs to."""
        inside = torch.is_inference_mode_enabled()
        if self.holds_inference and not inside:
            for layer in self.layers:
                layer.thaw()
            self.holds_inference = False
        self.holds_inference = self.holds_inference or inside

    def awaits_pass(self) -> bool:
        """True when a layer deferred its prefill eviction for a reconstruction pass not yet run."""
        return any(layer.awaits_pass() for layer in self.layers)

    @property
    def is_compileable(self) -> bool:  # eviction changes shapes every step
        return False


class PolyKVRuntime:
    """Applies a :class:`~strategies.Strategy` to a model; use through :func:`apply_strategy`.

    Parameters
    ----------
    decode_interval
        Decoding evicts a layer once every ``k`` steps instead of every step; 1 (default) is exact
        per-step eviction. Fewer evictions are faster; the kept sets differ from per-step eviction.
    interval_mode
        ``"within"`` (default): a layer never holds more than its budget; once over it, it evicts
        down to ``budget - k + 1`` tokens, so the next ``k - 1`` steps fit. ``"over"``: it evicts
        down to the budget every ``k`` steps and holds up to ``budget + k - 1`` tokens in between.
    reconstruction
        The repeat prompts of model-level patterns (``kvzip``), as token ids; default: the ones
        ``load_model`` attached to the model (``model.polykv_reconstruction``). A strategy with a
        model-level pattern and neither is refused (``ValueError``).
    """

    def __init__(
        self,
        model,
        strategy: Strategy,
        *,
        decode_interval: int = 1,
        interval_mode: str = "within",
        reconstruction: ReconstructionInputs | None = None,
        head_groups: dict[int, list[HeadGroupPlan]] | None = None,
    ):
        if not isinstance(decode_interval, int) or decode_interval < 1:
            raise ValueError(f"decode_interval must be a positive integer, got {decode_interval!r}")
        if interval_mode not in INTERVAL_MODES:
            raise ValueError(f"interval_mode must be one of {', '.join(INTERVAL_MODES)}, got {interval_mode!r}")
        _refuse_applied(model)
        self.model = model
        self.spec: ModelSpec = model_spec(model)
        strategy.check_model(self.spec.num_layers, self.spec.num_kv_heads)
        self.strategy = strategy
        self.decode_interval = decode_interval
        self.interval_mode = interval_mode
        self.plans = strategy_plans(strategy)
        self.head_groups = strategy_head_groups(strategy, self.spec.num_kv_heads)
        self.head_groups.update(head_groups or {})
        self.reconstruction = reconstruction or getattr(model, "polykv_reconstruction", None)
        group_plans = [(g.prefill, g.decoding) for groups in self.head_groups.values() for g in groups]
        check_plans(self.plans, [g for groups in self.head_groups.values() for g in groups], decode_interval)
        self.defer_prefill = needs_pass(self.plans + group_plans)
        if self.defer_prefill:
            self.pass_inputs()  # refuse now, not after the prefill
        self.kernel_impl = "eager" if self.spec.attn_implementation == "eager" else "sdpa"
        self.last_cache: PolyKVCache | None = None
        #: True inside the ``with`` block: only then may attention run through this runtime's layers.
        self.active = False
        self._hooks: list = []
        #: the last mask a reconstruction call converted (:func:`~polykv_search.runtime.view.flash_with_lse`)
        self.pass_masks: dict = {}

    # ---------------------------------------------------------------- lifetime
    def __enter__(self) -> PolyKVRuntime:
        _refuse_applied(self.model)
        attn.register()
        self.active = True
        self._forward_sig = inspect.signature(self.model.forward)
        self._hooks = [
            self.model.register_forward_pre_hook(self._inject_cache, with_kwargs=True),
            self.model.register_forward_hook(self._forward_done, always_call=True),
        ]
        self.model.set_attn_implementation(attn.ATTN_NAME)
        return self

    def __exit__(self, *exc) -> None:
        self.model.set_attn_implementation(self.spec.attn_implementation)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.active = False

    # ------------------------------------------------------------------ caches
    def new_cache(self) -> PolyKVCache:
        """An empty evicting cache for this model and strategy."""
        layers = [
            cache_layer(i, p, d, self.head_groups.get(i), defer_prefill=self.defer_prefill, **self.layer_kwargs(i))
            for i, (p, d) in enumerate(self.plans)
        ]
        return PolyKVCache(layers)

    def layer_kwargs(self, layer_idx: int) -> dict:
        """Constructor arguments, besides the two phase plans, of layer ``layer_idx``'s cache layer,
        wired to this runtime: ``EvictingLayer(layer_idx, prefill, decoding, **rt.layer_kwargs(layer_idx))``
        builds a layer the attention function finds, with plans of the caller's choosing (the signal
        collector's replay builds its cache layers this way; pass ``on_update=None`` for a detached one).
        They include the model's rotary embedding (``rotary``), which patterns read through
        ``LayerView.rotary_cos_sin``."""
        s = self.spec
        return dict(
            num_kv_heads=s.num_kv_heads,
            groups=s.num_heads // s.num_kv_heads,
            scaling=s.scaling,
            sliding_window=s.sliding_window(layer_idx),
            decode_interval=self.decode_interval,
            interval_mode=self.interval_mode,
            on_update=self._publish,
            rotary=s.rotary,
        )

    def _inject_cache(self, module, args, kwargs):
        bound = self._forward_sig.bind_partial(*args, **kwargs)
        extra = bound.arguments.get("kwargs", {})
        cache = bound.arguments.get("cache", extra.get("past_key_values"))
        use_cache = bound.arguments.get("use_cache")
        if use_cache is None:
            use_cache = getattr(self.spec.config, "use_cache", True)
        if isinstance(cache, PolyKVCache):
            _refuse_seen_tokens(cache, {**extra, **bound.arguments})
            cache.prepare_forward()
            self.last_cache = cache
            if cache.get_seq_length() == 0:
                self._record_prompt(cache, bound)
            return None
        if cache is None and not use_cache:  # the one case where attention runs without a cache layer
            extra[attn.PLAIN_KEY] = self
            bound.arguments["kwargs"] = extra
            return bound.args, bound.kwargs
        if cache is not None and not (isinstance(cache, DynamicCache) and cache.get_seq_length() == 0):
            raise ValueError(
                "polykv-search: the model was given a non-empty or non-dynamic cache; pass None, an empty "
                "DynamicCache or a cache from runtime.new_cache()"
            )
        extra.pop("past_key_values", None)
        bound.arguments["cache"] = self.last_cache = self.new_cache()
        self.last_cache.prepare_forward()
        self._record_prompt(self.last_cache, bound)
        return bound.args, bound.kwargs

    @staticmethod
    def _record_prompt(cache: PolyKVCache, bound) -> None:
        cache.prompt_ids = bound.arguments.get("input_ids")
        cache.prompt_mask = bound.arguments.get("attention_mask")

    def _forward_done(self, module, args, output) -> None:
        cache = self.last_cache
        if output is not None and cache is not None and cache.awaits_pass():
            self.finish_prefill(cache)

    def pass_inputs(self) -> ReconstructionInputs:
        """The repeat prompts a reconstruction pass reads (refused in one line when there are none)."""
        if self.reconstruction is None:
            raise ValueError(
                "polykv-search: this strategy uses a model-level pattern (kvzip), which needs the repeat "
                "prompt's token ids: load the model with polykv_search.models.load_model or pass "
                "reconstruction=ReconstructionInputs.from_tokenizer(tokenizer)"
            )
        return self.reconstruction

    def finish_prefill(self, cache: PolyKVCache) -> None:
        """Run the reconstruction pass over ``cache``'s prompt, then the deferred prefill evictions (the
        runtime does this itself after a prefill forward; the scoring engine calls it explicitly)."""
        if cache.prompt_ids is None:
            raise ValueError("polykv-search: a reconstruction pass needs the prompt as input_ids (not inputs_embeds)")
        plans = [pair for layer in cache.layers for pair in layer.pass_plans()]
        try:
            run_pass(self.model, cache, self.pass_inputs(), cache.prompt_ids, cache.prompt_mask, chunk_size(plans))
        finally:
            self.pass_masks.clear()

    def _publish(self, layer: RuntimeLayer, call: dict | None) -> None:
        """A cache layer's ``on_update``: hand it to the attention call that follows, through the ``kwargs``
        dict the model gives both ``cache.update`` and the attention function (:func:`attention.publish`)."""
        attn.publish(call, self, layer)

    # ----------------------------------------------------------------- report
    def report(self, cache: PolyKVCache | None = None) -> CacheReport:
        """Per-layer cache lengths and KV bytes held by ``cache`` (default: the latest one)."""
        cache = cache or self.last_cache
        if cache is None:
            raise RuntimeError("no cache yet: run the model first")
        return cache_report(cache.layers)


def _refuse_applied(model) -> None:
    """Refuse a second strategy on a model that runs one (its attention implementation is the runtime's)."""
    if getattr(model.config, "_attn_implementation", None) == attn.ATTN_NAME:
        raise RuntimeError("a strategy is already applied to this model")


def _refuse_seen_tokens(cache: PolyKVCache, arguments: dict) -> None:
    """Refuse a forward that feeds tokens the cache has already seen: it would hold them twice.
    ``generate(ids, cache=c)`` does that when ``c`` already holds every token of ``ids`` (it then feeds all
    of ``ids`` again, as it would with a ``DynamicCache``). With a 2-D attention mask the sign is a mask
    shorter than the tokens seen plus the new ones; without one (no padding), positions that do not reach
    past the tokens seen."""
    seen = cache.get_seq_length()
    new = next((arguments[k].shape[1] for k in ("input_ids", "inputs_embeds") if arguments.get(k) is not None), 0)
    if not seen or not new:
        return
    mask, positions = arguments.get("attention_mask"), arguments.get("position_ids")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        refused = mask.shape[1] < seen + new
    else:
        refused = isinstance(positions, torch.Tensor) and positions.numel() > 0 and int(positions.max()) < seen
    if refused:
        raise ValueError(
            f"polykv-search: this forward feeds {new} tokens that the cache has already seen ({seen} tokens): "
            "it would hold them twice. Pass only the new tokens; for generate(ids, cache=c), prefill c with "
            "all of ids but the last token"
        )


@contextmanager
def apply_strategy(
    model,
    strategy: Strategy,
    *,
    decode_interval: int = 1,
    interval_mode: str = "within",
    reconstruction: ReconstructionInputs | None = None,
    head_groups: dict[int, list[HeadGroupPlan]] | None = None,
) -> Iterator[PolyKVRuntime]:
    """Apply ``strategy`` to ``model`` inside a ``with`` block; the model is restored on exit.

    ``head_groups``: layers split into head groups (:class:`~polykv_search.runtime.layouts.HeadGroupPlan`),
    besides those the strategy's own choices split."""
    with PolyKVRuntime(
        model,
        strategy,
        head_groups=head_groups,
        decode_interval=decode_interval,
        interval_mode=interval_mode,
        reconstruction=reconstruction,
    ) as runtime:
        yield runtime
