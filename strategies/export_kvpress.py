"""``--format kvpress``: a Python module defining an NVIDIA kvpress press, plus its JSON sidecar.

kvpress (``pip install "kvpress>=0.5,<0.6"``; it pins transformers < 5.3, so it lives in its own
environment) compresses a transformers KV cache with forward hooks on the attention layers. Its
presses take a ``compression_ratio`` (the share of tokens to drop), not a token budget, and one press
normally serves every layer. The exported module defines ``PolyKVPress``, a
``kvpress.PrefillDecodingPress`` (so kvpress's pipeline applies it in both phases) that routes each
layer (``module.layer_idx``) to its own press:

* prefill: the kvpress counterpart of the layer's pattern, with the ratio computed at run time from
  the prompt length n: ``1 - (b + 1/2) / n`` (kvpress keeps ``int(n * (1 - ratio))`` tokens, so the
  half token makes float rounding harmless and exactly b are kept; n <= b keeps all);
* decoding: a ``kvpress.DecodingPress`` around the pattern's scorer with ``target_size`` = the
  decoding budget, compressing every ``DECODING_INTERVAL`` steps (1 by default, as polykv-search
  does). Patterns whose kvpress scorer cannot work during decoding (h2o, snapkv, pyramidkv,
  expected_attention) are dropped there: the layer then keeps every generated token, and the module
  docstring, the sidecar and the printed notes say so.

Pattern -> press: full -> none; streaming_llm -> StreamingLLMPress(n_sink); h2o ->
ObservedAttentionPress (prefill only; needs eager attention); tova -> TOVAPress; snapkv ->
SnapKVPress(window_size, kernel_size); pyramidkv -> SnapKVPress(window_size=8, kernel_size=7) (not
PyramidKVPress, which imposes its own budget schedule); knorm -> KnormPress; random ->
RandomPress(seed); keydiff -> KeyDiffPress; expected_attention -> ExpectedAttentionPress (its five
parameters; prefill only); kvzip -> KVzipPress(layerwise=True, n_sink), with kvzip_plus_normalization=True for
``plus`` (prefill only; not checked against kvpress). Where kvpress's press differs from the pattern,
the difference is listed per layer.

Head groups (schema version 2): a layer with head groups is routed to per-KV-head key masks (kvpress's
own mechanism for DuoAttentionPress and AdaKVPress), which keep exactly polykv-search's keys for
``full`` and ``streaming_llm`` groups in both phases and a scored pattern's per-head budget in prefill;
no memory is freed. What is refused, approximated with ``--approximate`` and noted is listed in
:mod:`strategies.kvpress_heads`; a duo-shaped strategy also gets ``duo_attention_press()``, kvpress's
DuoAttentionPress with the strategy's streaming heads and sink/recent sizes (prefill only).

The module and its sidecar are written as one set and both record the strategy digest; the
module's ``sidecar()`` and :func:`strategies.kvpress_sidecar.read_export` refuse a pair from two
different exports (see :mod:`strategies.kvpress_sidecar`).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from strategies.exporters import Export, ExportOptions, describe, header_lines
from strategies.kvpress_heads import HeadPlan, head_notes, head_plan, module_parts
from strategies.kvpress_presses import (  # noqa: F401  (re-exported: the press mapping lives there)
    DECODING_INTERVAL,
    KVPRESS_REQUIREMENT,
    SIDECAR_SCHEMA,
    Press,
    decoding_press,
    pattern_params,
    prefill_press,
)
from strategies.kvpress_sidecar import render_sidecar
from strategies.strategy import Strategy


class KVPressExporter:
    name: ClassVar[str] = "kvpress"
    description: ClassVar[str] = (
        "a Python module defining a kvpress press (per-layer presses and budgets) plus its JSON sidecar"
    )
    suffix: ClassVar[str | None] = ".py"
    uses: ClassVar[frozenset[str]] = frozenset({"approximate"})
    head_groups_refusal: ClassVar[str | None] = None  # strategies.kvpress_heads: key masks per KV head

    def render(self, strategy: Strategy, out: Path, options: ExportOptions) -> Export:
        module = out.stem
        sidecar = out.with_suffix(".json")
        heads = head_plan(strategy, options.approximate)
        grouped = [x is not None for x in heads.layers]
        pre = [None if g else prefill_press(c) for g, c in zip(grouped, strategy.prefill)]
        dec = [(None, None) if g else decoding_press(c) for g, c in zip(grouped, strategy.decoding)]
        differences = _differences(strategy, pre, dec, heads)
        notes = _general_notes(strategy, pre, dec, heads)
        lines = [f"{_ranges(layers)} {what}" for what, layers in differences.items()]
        parts = module_parts(strategy, heads)
        text = _module_text(strategy, module, sidecar.name, pre, dec, notes, lines, parts)
        side = render_sidecar(strategy, out.name, pre, dec, notes, heads)
        printed = [f"kvpress differs: {line}" for line in lines] + notes
        return Export({out: text, sidecar: side}, notes=printed, warnings=list(heads.warnings))


# ----------------------------------------------------------------------------- rendering
def _differences(strategy: Strategy, pre, dec, heads: HeadPlan) -> dict[str, list[int]]:
    """'prefill (snapkv): max pooling -> ...' -> layers, in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i in range(strategy.num_layers):
        for phase, rules in (heads.layers[i] or {}).items():
            for r in rules:
                for d in r.differences:
                    groups.setdefault(f"{phase} KV heads {list(r.heads)} ({r.source}): {d}", []).append(i)
        if pre[i] is not None:
            for d in pre[i].differences:
                groups.setdefault(f"prefill ({strategy.prefill[i].pattern}): {d}", []).append(i)
        press, dropped = dec[i]
        if dropped:
            groups.setdefault(f"decoding ({strategy.decoding[i].pattern}): {dropped}", []).append(i)
        elif press is not None:
            for d in press.differences:
                groups.setdefault(f"decoding ({strategy.decoding[i].pattern}): {d}", []).append(i)
    return groups


def _general_notes(strategy: Strategy, pre, dec, heads: HeadPlan) -> list[str]:
    notes = head_notes() if heads.any else []
    if heads.any and all(p is None for p in pre) and all(d[0] is None for d in dec):
        return notes  # every layer holds every token: no lengths differ
    notes += [
        "layers hold different numbers of tokens, which transformers' one attention mask per forward does "
        "not allow for: run with attn_implementation='flash_attention_2', or 'sdpa' with batch size 1, "
        "no padding and one token per decoding step; kvpress's pipeline feeds the question as one "
        "multi-token step, so it needs flash_attention_2 (kvpress's PerLayerCompressionPress has the same limit)"
    ]
    if any(p is not None and p.cls == "ObservedAttentionPress" for p in pre):
        notes.append(
            "ObservedAttentionPress (h2o layers) reads attention weights: load the model with "
            "attn_implementation='eager', and with eager only prefill works once layer lengths differ"
        )
    if any(p is not None and p.cls == "SnapKVPress" for p in pre):
        window = max(p.params["window_size"] for p in pre if p is not None and p.cls == "SnapKVPress")
        notes.append(f"SnapKVPress needs prompts longer than its window_size (up to {window} here; kvpress asserts it)")
    return notes


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> 'layers 0-2, 5'; [3] -> 'layer 3'."""
    parts: list[str] = []
    start = prev = layers[0]
    for x in layers[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(parts)


def _entry(press: Press | None, budget: int | None) -> str:
    if press is None:
        return "None"
    return f"({press.cls!r}, {press.params!r}, {budget})"


def _module_text(strategy, module, sidecar, pre, dec, notes, diff_lines, parts) -> str:
    L = strategy.num_layers
    prefill_rows = []
    decoding_rows = []
    for i in range(L):
        p, d = strategy.prefill[i], strategy.decoding[i]
        if p.has_head_groups or d.has_head_groups:
            prefill_rows.append(f"    None,  # layer {i}: head groups (HEAD_GROUPS)")
            decoding_rows.append(f"    None,  # layer {i}: head groups (HEAD_GROUPS)")
            continue
        prefill_rows.append(f"    {_entry(pre[i], p.budget)},  # layer {i}: {describe(p)}")
        press, dropped = dec[i]
        tail = " (dropped, see above)" if dropped else ""
        decoding_rows.append(f"    {_entry(press, d.budget)},  # layer {i}: {describe(d)}{tail}")
    wrapped_notes = "\n".join(_bullet(n) for n in notes)
    if diff_lines:
        differs = "What kvpress does differently from polykv-search:\n" + "\n".join(_bullet(x) for x in diff_lines)
    else:
        differs = "kvpress runs every layer as the strategy says (up to the notes above)."
    header = header_lines(strategy)[0]
    return f'''"""kvpress press for a polykv-search strategy ({header}).

Generated by `polykv-search export --format kvpress`; regenerate it rather than edit it. {sidecar}
beside it lists the same mapping per layer, with the differences.

Needs kvpress 0.5.x (pip install "{KVPRESS_REQUIREMENT}"; it brings transformers < 5.3) and a model
with {L} layers. Use it like any kvpress press:

    from {module} import make_press
    press = make_press()
    with press(model):                     # prefill: each layer is compressed to its own budget
        model(input_ids, past_key_values=cache)
    # or kvpress's pipeline (prefill and decoding; needs flash_attention_2, see the notes):
    # pipeline("kv-press-text-generation", model=model)(context, question=q, press=press)

Prefill: layer l runs the kvpress press in PREFILL[l] with compression_ratio = 1 - (b + 1/2) / n for
a prompt of n tokens, computed at run time (kvpress keeps int(n * (1 - ratio)) tokens, so exactly b
stay; n <= b keeps all). None: the layer keeps every token.
Decoding: DECODING[l] is wrapped in a kvpress DecodingPress that compresses the layer back to its
decoding budget b whenever it is over it, every DECODING_INTERVAL steps (1: every step, as
polykv-search does). None: no eviction while decoding.
{parts["doc"]}
Notes:
{wrapped_notes}

{differs}
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import kvpress{parts["imports"]}

NUM_LAYERS = {L}
#: digest of the strategy this module was exported from; its sidecar records the same one
STRATEGY_DIGEST = "{strategy.digest()}"
SIDECAR = "{sidecar}"
DECODING_INTERVAL = {DECODING_INTERVAL}

#: per layer: (kvpress press class, its parameters, token budget), or None: keep every token
PREFILL = [
{chr(10).join(prefill_rows)}
]

#: per layer: (kvpress scorer press for DecodingPress, its parameters, token budget), or None
DECODING = [
{chr(10).join(decoding_rows)}
]{parts["tables"]}


def ratio_for(budget: int, length: int) -> float:
    """The compression_ratio with which kvpress keeps exactly ``budget`` of ``length`` tokens."""
    if length <= budget:
        return 0.0
    return 1.0 - (budget + 0.5) / length


def is_prefill(kwargs: dict) -> bool:
    """The attention call processes a prompt into an empty cache (kvpress's own test)."""
    return int(kwargs["cache_position"][-1]) + 1 == kwargs["hidden_states"].shape[1]


@dataclass
class PolyKVPress(kvpress.PrefillDecodingPress):
    """Routes each attention layer to its own kvpress press (prefill) and DecodingPress (decoding)."""

    decoding_interval: int = DECODING_INTERVAL
    prefill_presses: list = field(default_factory=list, init=False, repr=False)
    decoding_presses: list = field(default_factory=list, init=False, repr=False){parts["fields"]}

    def __post_init__(self):
        self.prefill_presses = [
            None if e is None else (getattr(kvpress, e[0])(**e[1]), e[2]) for e in PREFILL
        ]
        self.decoding_presses = [
            None
            if e is None
            else kvpress.DecodingPress(
                base_press=getattr(kvpress, e[0])(**e[1]),
                compression_interval=self.decoding_interval,
                target_size=e[2],
                hidden_states_buffer_size=0,
            )
            for e in DECODING
        ]{parts["post_init"]}

    def post_init_from_model(self, model):
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if config.num_hidden_layers != NUM_LAYERS:
            raise ValueError(
                f"this press was exported for {{NUM_LAYERS}} layers; the model has {{config.num_hidden_layers}}"
            )
        for entry in self.prefill_presses:
            if entry is not None:
                entry[0].post_init_from_model(model)
        for press in self.decoding_presses:
            if press is not None:
                press.post_init_from_model(model){parts["post_init_model"]}

    def forward_hook(self, module, input, kwargs, output):
        i = module.layer_idx{parts["route"]}
        if is_prefill(kwargs):
            entry = self.prefill_presses[i]
            if entry is None:
                return output
            press, budget = entry
            press.compression_ratio = ratio_for(budget, kwargs["hidden_states"].shape[1])
            try:
                return press.forward_hook(module, input, kwargs, output)
            finally:
                press.compression_ratio = 0.0
        press = self.decoding_presses[i]
        return output if press is None else press.forward_hook(module, input, kwargs, output){parts["method"]}

    def reset(self):
        for press in self.decoding_presses:
            if press is not None:
                press.reset()

    @contextmanager
    def __call__(self, model):
        try:
            with super().__call__(model):
                yield
        finally:
            self.reset()


def make_press(decoding_interval: int = DECODING_INTERVAL) -> PolyKVPress:
    return PolyKVPress(decoding_interval=decoding_interval)


def sidecar() -> dict:
    """The JSON sidecar beside this module; refused when it was exported from another strategy."""
    doc = json.loads((Path(__file__).with_name(SIDECAR)).read_text(encoding="utf-8"))
    if doc.get("strategy_digest") != STRATEGY_DIGEST:
        raise ValueError(
            f"{{SIDECAR}} was exported from strategy {{doc.get('strategy_digest')}}, this module from {{STRATEGY_DIGEST}}; "
            "export them again together"
        )
    return doc{parts["tail"]}
'''  # noqa: E501 - the generated module's text (long lines are its own), tested byte for byte


def _bullet(text: str, width: int = 100) -> str:
    """'  - text' wrapped at ``width`` with a hanging indent."""
    import textwrap

    return textwrap.fill(
        text,
        width=width,
        initial_indent="  - ",
        subsequent_indent="    ",
        break_on_hyphens=False,
        break_long_words=False,
    )
