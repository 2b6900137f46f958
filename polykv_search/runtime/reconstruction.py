"""The reconstruction pass of model-level patterns (``kvzip``): a fourth hook point, run once per prompt.

A pattern with ``model_level = True`` scores the prompt by how much a "repeat the context" pass attends
to each cached token (KVzip, https://arxiv.org/abs/2505.23416). That pass needs the whole prompt
cached in *every* layer, so when a strategy uses such a pattern in either phase, every layer of the
cache defers its prefill eviction (``EvictingLayer.defer_prefill``). After the prefill forward the
runtime calls :func:`run_pass`: for each chunk of the prompt the model's decoder reads a repeat prompt
and that chunk's tokens, teacher-forced over the cache; each layer appends these tokens, runs its
kernel, hands the call to the model-level patterns' ``reconstruct(layer, state, query, prompt_len, lse, inputs)``
(no other pattern observes the pass) and cuts itself back to the prompt. ``inputs`` (what the attention
module read beyond its queries, for ``kvzip[plus=true]``) are handed over only when a pattern of the pass
needs them (:func:`handing_pass_inputs`: a forward pre-hook per attention module, no cost otherwise).
Then every deferred layer evicts as its prefill plan says. Positions and ``seen`` are those of a run
without the pass, so ``generate()`` continues unchanged. Cost: one more forward over the prompt (plus the
repeat prompts), whose queries attend over the whole cache (at 4k with 2,048-token chunks, about 3x the prefill's
attention), plus kvzip's scores: one product of the pass's queries with the prompt's keys per call,
normalised by the log-sum-exp the kernel itself computed (CPU SDPA's flash kernel,
:func:`~polykv_search.runtime.view.flash_with_lse`), which the layer hands to ``reconstruct`` as its ``lse``
argument, instead of a second softmax over the whole cache.
Pooled allocations (``kvzip``'s ``allocation``) are formed between the pass and the deferred evictions
(:mod:`polykv_search.runtime.pooled`).

The repeat prompts (:class:`ReconstructionInputs`) are token ids; ``load_model`` attaches them to the
model it loads (``model.polykv_reconstruction``), built from its tokenizer as KVzip builds them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from polykv_search.runtime.architectures import attention_modules, attention_pass_inputs
from polykv_search.runtime.attention import PASS_KEY
from polykv_search.runtime.layer import DECODING, PREFILL
from polykv_search.runtime.pooled import allocate, pool_entries

FIRST_PROMPT = "\n\nRepeat the previous context exactly."
LATER_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with"


@dataclass(frozen=True)
class ReconstructionInputs:
    """Token ids of the repeat prompts.

    Chunk 0 reads ``first + suffix + chunk``; chunk ``i > 0`` reads ``later + (the previous chunk's
    last overlap tokens) + suffix + chunk`` (KVzip's prompts; ``suffix`` is the chat template's turn
    change to the assistant, empty without a template).
    """

    first: tuple[int, ...]
    later: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    overlap: int = 8

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ReconstructionInputs:
        suffix = ""
        if getattr(tokenizer, "chat_template", None):
            marker = "\x00polykv\x00"
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": marker}], add_generation_prompt=True, tokenize=False
            )
            suffix = text.split(marker, 1)[1] if marker in text else ""

        def ids(text: str) -> tuple[int, ...]:
            return tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()

        return cls(ids(FIRST_PROMPT), ids(LATER_PROMPT), ids(suffix))

    def chunk_ids(self, prompt: Sequence[int], start: int, stop: int) -> list[int]:
        """The pass input of the prompt slice ``prompt[start:stop]`` (real tokens of one row)."""
        if start == 0:
            head = list(self.first)
        else:
            head = list(self.later) + list(prompt[max(0, start - self.overlap) : start])
        return head + list(self.suffix) + list(prompt[start:stop])


def needs_pass(plans) -> bool:
    """True when any layer of these ``(prefill, decoding)`` plans uses a model-level pattern."""
    return any(plan.evicts and plan.pattern.model_level for pair in plans for plan in pair)


def needs_pass_inputs(plans) -> bool:
    """True when a model-level pattern of these ``(prefill, decoding)`` plans needs the attention modules'
    :class:`~polykv_search.patterns.base.PassInputs` (``kvzip[plus=true]``)."""
    return any(plan.evicts and plan.pattern.model_level and plan.pattern.needs_pass_inputs for p in plans for plan in p)


@contextmanager
def handing_pass_inputs(model, needed: bool) -> Iterator[None]:
    """While open (and ``needed``), every attention module of ``model`` hands its call's
    :class:`~polykv_search.patterns.base.PassInputs` (``architectures.attention_pass_inputs``) to the attention
    function through its ``kwargs`` (:data:`~polykv_search.runtime.attention.PASS_KEY`), and on
    to the cache layer's ``observe_pass``: a forward pre-hook per module, none when not ``needed``."""
    if not needed:
        yield
        return

    def tap(module, args, kwargs):
        return args, {**kwargs, PASS_KEY: attention_pass_inputs(module, args, kwargs)}

    handles = [module.register_forward_pre_hook(tap, with_kwargs=True) for module in attention_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def chunk_size(plans) -> int:
    """The smallest ``chunk_size`` of the model-level patterns in ``plans``."""
    sizes = [plan.pattern.chunk_size for pair in plans for plan in pair if plan.pattern.model_level]
    return min(size for size in sizes if size is not None)


def run_pass(model, cache, inputs: ReconstructionInputs, prompt_ids: torch.Tensor, prompt_mask, size: int) -> None:
    """Run the reconstruction pass over ``cache`` (its layers hold the prompt ``prompt_ids`` ``[B, n]``,
    left padding marked by ``prompt_mask``, None: none), then the deferred evictions."""
    layers = cache.layers
    b, n = prompt_ids.shape
    real = [
        prompt_ids[r].tolist() if prompt_mask is None else prompt_ids[r][prompt_mask[r].bool()].tolist()
        for r in range(b)
    ]
    pads = [n - len(row) for row in real]
    decoder = model.get_decoder()
    device = prompt_ids.device
    tap = needs_pass_inputs(pair for layer in layers for pair in layer.pass_plans())
    for layer in layers:
        layer.begin_pass(n)
    try:
        with torch.no_grad(), handing_pass_inputs(model, tap):
            for start in range(0, n, size):
                stop = min(start + size, n)
                # a row's real tokens in this slice of the (left-padded) prompt
                rows = [inputs.chunk_ids(row, max(0, start - pad), max(0, stop - pad)) for row, pad in zip(real, pads)]
                width = max(len(row) for row in rows)
                ids = torch.zeros(b, width, dtype=torch.long, device=device)
                mask = torch.zeros(b, n + width, dtype=torch.long, device=device)
                mask[:, :n] = 1 if prompt_mask is None else prompt_mask
                for r, row in enumerate(rows):
                    ids[r, width - len(row) :] = torch.tensor(row, dtype=torch.long, device=device)
                    mask[r, n + width - len(row) :] = 1
                decoder(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    finally:
        for layer in layers:
            layer.end_pass()
    entries = pool_entries(layers)
    allocate(entries, PREFILL)  # pooled allocations (kvzip's allocation="layer"/"model") rank the pass's scores
    for layer in layers:  # in the caller's grad mode: a store made without it could not take later tokens
        layer.finish_deferred()
    allocate(entries, DECODING)
