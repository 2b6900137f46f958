"""``--format vllm``: ``hf_overrides`` JSON (``layer_types``, ``sliding_window``) for vLLM.

vLLM reads, for models whose implementation supports interleaved attention (its Llama-family
implementation among them), ``layer_types[l]`` = ``"full_attention"`` or ``"sliding_attention"``
and ONE ``sliding_window`` for every sliding layer; a sliding window keeps no sink tokens. So it
expresses exactly the strategies whose layers are ``full`` or ``streaming_llm`` with ``n_sink=0``
and one budget for all of them, the same in both phases (window = budget). Its sliding window applies
to both phases: prompt tokens of a sliding layer attend only within the window (polykv-search lets
the whole prompt attend, then compresses) and while decoding the window is the layer's capacity
(KV memory is freed in whole blocks).

Anything else is refused with a one-line message naming the first layer it cannot express;
``--approximate`` instead uses the prefill choice for both phases, maps other patterns to a sliding
window of their budget, drops sinks, gives a layer with head groups one setting that keeps every head's
tokens (``full`` when one of its heads keeps everything: more memory than the strategy holds;
:func:`~strategies.exporters.cover_head_groups`), and gives every sliding layer the mean window
(rounded down, so the total stays within the strategy's), printing every change. Use::

    vllm serve MODEL --hf-overrides "$(cat strategy.vllm.json)"
    LLM(MODEL, hf_overrides=json.load(open("strategy.vllm.json")))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from strategies.exporters import Export, ExportOptions, _Issue, check_issues, window_plan
from strategies.strategy import Strategy

TARGET = "vLLM"

NOTE_PHASES = (
    "vLLM applies sliding_window in both phases: prompt tokens of a sliding layer attend only within "
    "the window (polykv-search lets the whole prompt attend, then compresses), and while decoding the "
    "window is the layer's capacity"
)
NOTE_MODEL = (
    "the model's vLLM implementation must read layer_types and sliding_window from its config "
    "(vLLM's Llama-family implementation does; check yours)"
)


class VLLMExporter:
    name: ClassVar[str] = "vllm"
    description: ClassVar[str] = "vLLM hf_overrides JSON: layer_types (full/sliding) and one sliding_window"
    suffix: ClassVar[str | None] = ".json"
    uses: ClassVar[frozenset[str]] = frozenset({"approximate"})
    head_groups_refusal: ClassVar[str | None] = "vLLM has one attention window per layer for all its heads"

    def render(self, strategy: Strategy, out: Path, options: ExportOptions) -> Export:
        layers, issues = window_plan(
            strategy,
            target=TARGET,
            what_it_keeps="keeps only full layers and sliding windows without sinks "
            "(full, streaming_llm with n_sink=0)",
        )
        for x, _ in zip(layers, strategy.prefill):
            if x.window is not None and x.n_sink:
                issues.append(
                    _Issue(
                        x.layer,
                        f"layer {x.layer} (prefill {x.source}): vLLM's sliding window keeps no sink tokens",
                        f"layer {x.layer}: n_sink={x.n_sink} -> 0 (vLLM's sliding window keeps no sinks)",
                    )
                )
        windowed = [x for x in layers if x.window is not None]
        window = None
        if windowed:
            sizes = [x.window for x in windowed if x.window is not None]
            window = sizes[0] if len(set(sizes)) == 1 else sum(sizes) // len(sizes)
            first = windowed[0]
            # Refuse naming the first layer that differs from the first sliding layer; approximate to the mean.
            reference = window if options.approximate else first.window
            issues += [
                _Issue(
                    x.layer,
                    f"layer {x.layer} (prefill {x.source}): vLLM has one sliding_window for all layers "
                    f"and layer {first.layer} has {first.window}",
                    f"layer {x.layer}: window {x.window} -> {window} (vLLM has one sliding_window: the mean)",
                )
                for x in windowed
                if x.window != reference
            ]
        changes = check_issues(issues, fmt=self.name, approximate=options.approximate)
        body = {
            "layer_types": ["full_attention" if x.window is None else "sliding_attention" for x in layers],
            "sliding_window": window,
            "use_sliding_window": window is not None,
        }
        notes = [NOTE_PHASES, NOTE_MODEL] if windowed else [NOTE_MODEL]
        return Export({out: _dumps(body)}, notes=notes, warnings=changes)


def _dumps(body: dict) -> str:
    """Indented JSON with ``layer_types`` on one line (30 layers stay readable)."""
    items = [f'  "layer_types": {json.dumps(body["layer_types"])}']
    items += [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in body.items() if k != "layer_types"]
    return "{\n" + ",\n".join(items) + "\n}\n"
