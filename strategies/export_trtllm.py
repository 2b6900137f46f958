"""``--format trtllm``: TensorRT-LLM ``KvCacheConfig`` settings as YAML.

TensorRT-LLM keeps, per layer, a window of the last ``max_attention_window[l]`` tokens (a cyclic KV
cache), and with ``sink_token_length`` = S the first S tokens of the sequence always stay inside that
window (StreamingLLM). So it expresses exactly the layers that are ``full`` (window =
``--max-seq-len``) or ``streaming_llm`` (window = the budget, sinks included), with one sink count
for the whole model. Its window applies to both phases: while the prompt is processed a windowed
layer attends only within its window (sliding-window attention), where polykv-search lets the whole
prompt attend and compresses afterwards; while decoding it is the layer's capacity. A layer whose
prefill and decoding choices differ, or whose pattern is neither full nor streaming_llm, is refused
with a one-line message naming it; ``--approximate`` instead uses the prefill choice for both phases,
maps other patterns to a sliding window of the same budget (with the model's sink count), picks the
most common sink count if layers disagree, gives a layer with head groups one setting that keeps every
head's tokens (``full`` when one of its heads keeps everything: more memory than the strategy holds,
said in the change; :func:`~strategies.exporters.cover_head_groups`), and prints every change.

The file is the ``kv_cache_config`` section of TensorRT-LLM's LLM-API options::

    trtllm-serve MODEL --extra_llm_api_options strategy.yaml
    LLM(MODEL, kv_cache_config=KvCacheConfig(**yaml.safe_load(open("strategy.yaml"))["kv_cache_config"]))
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from strategies.exporters import (
    Export,
    ExportError,
    ExportOptions,
    _Issue,
    check_issues,
    header_lines,
    most_common,
    window_plan,
)
from strategies.strategy import Strategy

TARGET = "TensorRT-LLM"

NOTE_PHASES = (
    "TensorRT-LLM applies each layer's window in both phases: prompt tokens of a windowed layer attend "
    "only within the window (polykv-search lets the whole prompt attend, then compresses), and while "
    "decoding the window is the layer's capacity"
)
NOTE_SINKS = (
    "sink tokens need a TensorRT-LLM build with StreamingLLM support (e.g. engines built with "
    "--streamingllm enable); its StreamingLLM mode places RoPE by position in the cache, "
    "polykv-search keeps absolute positions"
)


class TRTLLMExporter:
    name: ClassVar[str] = "trtllm"
    description: ClassVar[str] = "TensorRT-LLM KvCacheConfig YAML: per-layer max_attention_window and sink_token_length"
    suffix: ClassVar[str | None] = None
    uses: ClassVar[frozenset[str]] = frozenset({"approximate", "max_seq_len"})
    head_groups_refusal: ClassVar[str | None] = "TensorRT-LLM has one attention window per layer for all its heads"

    def render(self, strategy: Strategy, out: Path, options: ExportOptions) -> Export:
        layers, issues = window_plan(
            strategy,
            target=TARGET,
            what_it_keeps="keeps only full layers and sliding windows with sinks (full, streaming_llm)",
        )
        # One sink count for the whole model: the streaming_llm layers' own; mapped layers follow it.
        own = [x for x in layers if x.streaming]
        sinks = most_common([x.n_sink for x in own]) if own else 0
        if own:
            first = next(x.layer for x in own if x.n_sink == sinks)
            issues += [
                _Issue(
                    x.layer,
                    f"layer {x.layer} (prefill {x.source}): TensorRT-LLM has one sink_token_length for all "
                    f"layers and layer {first} has n_sink={sinks}",
                    f"layer {x.layer}: n_sink={x.n_sink} -> {sinks} (TensorRT-LLM has one sink_token_length)",
                )
                for x in own
                if x.n_sink != sinks
            ]
        if sinks:
            for issue in issues:
                if issue.mapped:
                    issue.change += f" with the model's {sinks} sink tokens"
        changes = check_issues(issues, fmt=self.name, approximate=options.approximate)
        windowed = [x for x in layers if x.window is not None]
        full = [x for x in layers if x.window is None]
        if full and windowed and options.max_seq_len is None:
            raise ExportError(
                f"trtllm needs --max-seq-len: layer {full[0].layer} is full, and TensorRT-LLM gives a full "
                "layer a window of the engine's max sequence length"
            )
        max_seq_len = options.max_seq_len
        notes = [NOTE_PHASES] if windowed else []
        if windowed and sinks:
            notes.append(NOTE_SINKS)
        clamped = [
            x.layer for x in windowed if max_seq_len is not None and x.window is not None and x.window >= max_seq_len
        ]
        if clamped:
            which = f"layer {clamped[0]}" if len(clamped) == 1 else f"layers {', '.join(map(str, clamped))}"
            notes.append(f"{which}: budget >= --max-seq-len {max_seq_len}, so the window is {max_seq_len} (full)")
        text = _yaml(strategy, layers, sinks, max_seq_len, notes, changes)
        return Export({out: text}, notes=notes, warnings=changes)


def _yaml(strategy: Strategy, layers, sinks: int, max_seq_len: int | None, notes: list[str], changes: list[str]) -> str:
    lines = [f"# TensorRT-LLM KV-cache settings exported by polykv-search: {header_lines(strategy)[0]}."]
    lines += [
        "# Use: trtllm-serve MODEL --extra_llm_api_options THIS_FILE, or",
        '#      LLM(MODEL, kv_cache_config=KvCacheConfig(**yaml.safe_load(open(THIS_FILE))["kv_cache_config"])).',
    ]
    lines += [_comment(f"Note: {c}.") for c in notes]
    lines += [_comment(f"Approximated (--approximate): {c}.") for c in changes]
    if all(x.window is None for x in layers):
        lines += ["# Every layer keeps every token (FullKV): nothing to limit.", "kv_cache_config: {}"]
        return "\n".join(lines) + "\n"
    lines += [
        _comment(
            "max_attention_window[l]: the tokens layer l keeps (its budget, sinks included); "
            "full layers get max_seq_len."
        ),
        "kv_cache_config:",
        "  max_attention_window:",
    ]
    for x in layers:
        window = max_seq_len if x.window is None else (x.window if max_seq_len is None else min(x.window, max_seq_len))
        lines.append(f"    - {window}  # layer {x.layer}: {x.source}")
    lines.append(f"  sink_token_length: {sinks}")
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    import textwrap

    return textwrap.fill(
        text, width=100, initial_indent="# ", subsequent_indent="#   ", break_on_hyphens=False, break_long_words=False
    )
