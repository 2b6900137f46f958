"""Exporters: translate a :class:`~strategies.Strategy` into what another runtime reads.

One exporter per file (``strategies/export_<name>.py``), registered here by name::

    >>> from strategies.exporters import list_formats, get_exporter
    >>> list_formats()
    ['json', 'kvpress', 'trtllm', 'vllm']
    >>> get_exporter("kvpress").suffix
    '.py'

The protocol is small. An exporter has a ``name``, a one-line ``description``, the ``suffix`` it
expects ``--out`` to have (``None``: any), the set ``uses`` of :class:`ExportOptions` fields it reads
(``approximate`` among them when it can approximate), and ``render(strategy, out, options) -> Export``.
An option the format does not read is refused, never ignored. ``render`` never writes:
it returns every file's text, so a refused export leaves nothing behind; :func:`write_export`
writes the files atomically afterwards.

``approximate`` is a permission, not an instruction: without it an exporter refuses (with
:class:`ExportError`, naming the first layer and pattern it cannot express) whatever it would have to
change; with it, it changes those layers and lists every change in ``Export.warnings``.
``Export.notes`` are true of the target whatever the strategy (what it applies in which phase).

Head groups (schema version 2): an exporter that can express them sets ``head_groups_refusal`` to
``None`` (``json``, and ``kvpress`` through per-head key masks, :mod:`strategies.kvpress_heads`, which
refuses what it cannot express itself); every other one names, in that class attribute, why its target
cannot, and :func:`render_export` refuses a strategy with head groups with that one line unless
``--approximate``. The window exporters then give each grouped layer one setting that covers its groups
(:func:`cover_head_groups`): a layer with a head that keeps everything becomes a full layer, never a
window (merging a retrieval head into its streaming neighbours would drop exactly what the strategy
keeps), so the approximation holds more memory than the strategy, and each change says how much.

The helpers at the end (:func:`window_plan`) are shared by the exporters whose targets only know
full attention and sliding windows (TensorRT-LLM, vLLM).
"""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from strategies.catalog import make_pattern
from strategies.choice import PHASES, LayerChoice
from strategies.io import atomic_write_files

if TYPE_CHECKING:  # pragma: no cover
    from strategies.strategy import Strategy


class ExportError(ValueError):
    """The strategy cannot be expressed in the requested format (or the export options are wrong)."""


@dataclass(frozen=True)
class ExportOptions:
    """What ``polykv-search export`` passes to an exporter besides the strategy and ``--out``."""

    #: Allow changing what the target cannot express (each change is listed in ``Export.warnings``).
    approximate: bool = False
    #: The serving engine's maximum sequence length (TensorRT-LLM needs it as the window of full layers).
    max_seq_len: int | None = None


@dataclass
class Export:
    """What an exporter produced: files (path -> text, in writing order), notes and warnings."""

    files: dict[Path, str]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def main(self) -> Path:
        return next(iter(self.files))


class Exporter(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    suffix: ClassVar[str | None]
    uses: ClassVar[frozenset[str]]
    #: Why the target cannot express head groups (``None``: it can); a missing attribute refuses them.
    head_groups_refusal: ClassVar[str | None]

    def render(self, strategy: Strategy, out: Path, options: ExportOptions) -> Export: ...


#: format name -> "module:Class". Modules are imported on first use.
EXPORTERS: dict[str, str] = {
    "json": "strategies.export_json:JSONExporter",
    "kvpress": "strategies.export_kvpress:KVPressExporter",
    "trtllm": "strategies.export_trtllm:TRTLLMExporter",
    "vllm": "strategies.export_vllm:VLLMExporter",
}


def list_formats() -> list[str]:
    return list(EXPORTERS)


def get_exporter(name: str) -> Exporter:
    try:
        target = EXPORTERS[name]
    except KeyError:
        raise ExportError(f"unknown export format {name!r}; known: {', '.join(EXPORTERS)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


def render_export(strategy: Strategy, fmt: str, out: str | Path, options: ExportOptions | None = None) -> Export:
    """Check the options against the format, then render (nothing is written)."""
    options = options or ExportOptions()
    exporter = get_exporter(fmt)
    if options.max_seq_len is not None and "max_seq_len" not in exporter.uses:
        raise ExportError(f"--max-seq-len does not apply to --format {fmt}")
    if options.approximate and "approximate" not in exporter.uses:
        raise ExportError(
            f"--approximate does not apply to --format {fmt}: it expresses every strategy exactly "
            "(--approximate is for kvpress, trtllm and vllm)"
        )
    if options.max_seq_len is not None and (isinstance(options.max_seq_len, bool) or options.max_seq_len < 1):
        raise ExportError(f"--max-seq-len must be a positive integer, got {options.max_seq_len!r}")
    refusal = getattr(exporter, "head_groups_refusal", "it does not declare head-group support")
    where = strategy.first_head_groups()
    if where is not None and refusal is not None and not options.approximate:
        how = ", or --approximate to give each grouped layer one setting that keeps every head's tokens"
        raise ExportError(
            f"{fmt} cannot express head groups ({where}): {refusal}; use --format json"
            + (how if "approximate" in exporter.uses else "")
        )
    out = Path(out)
    if exporter.suffix is not None and out.suffix != exporter.suffix:
        raise ExportError(f"--out for --format {fmt} must end in {exporter.suffix}, got {str(out)!r}")
    return exporter.render(strategy, out, options)


def write_export(export: Export) -> list[Path]:
    """Write the files of ``export`` as one set: all staged, then renamed (none is written if any
    cannot be staged). Files of multi-file formats carry the strategy digest of their partner, so a
    set mixed by a kill between two renames is refused by the format's reader."""
    try:
        return atomic_write_files(export.files)
    except OSError as err:
        name = err.filename or export.main
        raise ExportError(f"cannot write {name}: {err.strerror or err}") from None


def export_strategy(strategy: Strategy, fmt: str, out: str | Path, options: ExportOptions | None = None) -> Export:
    """Render then write; raises :class:`ExportError` (and writes nothing) when the format refuses."""
    export = render_export(strategy, fmt, out, options)
    write_export(export)
    return export


# ----------------------------------------------------------------------------- shared helpers
def describe(choice: LayerChoice) -> str:
    """``snapkv(window=8) budget 40`` / ``full``: a layer choice in one short phrase."""
    if choice.pattern == "full" or choice.budget is None:
        return "full" if choice.pattern == "full" else f"{choice.pattern} (unbounded)"
    params = ", ".join(f"{k}={v}" for k, v in sorted(dict(choice.params).items()))
    return f"{choice.pattern}{f'({params})' if params else ''} budget {choice.budget}"


def n_sink_of(choice: LayerChoice) -> int:
    return int(make_pattern(choice.pattern, **dict(choice.params)).n_sink)


@dataclass
class WindowLayer:
    """One layer as a full-attention or sliding-window layer (``window=None``: full)."""

    layer: int
    window: int | None
    n_sink: int
    source: str  # what the strategy asked for, for comments
    streaming: bool = False  # a streaming_llm layer (its sinks are its own, not a mapped pattern's)


@dataclass
class _Issue:
    layer: int
    refusal: str  # "layer 3 (prefill snapkv budget 40)"
    change: str  # "layer 3: snapkv budget 40 -> sliding window of 40"
    mapped: bool = False  # a pattern the target lacks, mapped to a sliding window


def window_plan(
    strategy: Strategy,
    *,
    target: str,
    what_it_keeps: str,
) -> tuple[list[WindowLayer], list[_Issue]]:
    """Map every layer to full attention or a sliding window (with the layer's own sink count).

    The targets apply one setting per layer to both phases, so a layer is expressible when its
    prefill and decoding choices are the same and are ``full`` (any budget) or ``streaming_llm``.
    Otherwise (with ``--approximate``) the prefill choice is used for both phases and any other
    pattern becomes a sliding window of the same budget; without it, :class:`ExportError` names the
    first such layer. Returns the layers and the issues (empty when exact); the caller adds its
    target-wide limits (one sink count, one window size) and passes them all to :func:`check_issues`.
    """
    layers: list[WindowLayer] = []
    issues: list[_Issue] = []
    for i, choices in enumerate(zip(strategy.prefill, strategy.decoding)):
        pre, dec = (_covered(c, i, phase, strategy, target, issues) for c, phase in zip(choices, PHASES))
        kp, kd = _window_key(pre), _window_key(dec)
        if kp[0] == "other":
            issues.append(
                _Issue(
                    i,
                    f"layer {i} (prefill {describe(pre)}): {target} {what_it_keeps}",
                    f"layer {i}: {describe(pre)} -> sliding window of {pre.budget}",
                    mapped=True,
                )
            )
        if kp != kd:
            issues.append(
                _Issue(
                    i,
                    f"layer {i} (prefill {describe(pre)}, decoding {describe(dec)}): "
                    f"{target} applies one setting per layer to both phases",
                    f"layer {i}: decoding {describe(dec)} -> same as prefill ({describe(pre)}), "
                    f"{target} has one setting per layer for both phases",
                )
            )
        if pre.pattern == "full" or pre.budget is None:  # _window_key's "full"
            layers.append(WindowLayer(i, None, 0, describe(pre)))
        else:
            window = kp[0] == "window"
            layers.append(WindowLayer(i, int(pre.budget), kp[2] if window else 0, describe(pre), streaming=window))
    return layers, issues


def cover_head_groups(choice: LayerChoice, context_len: int) -> LayerChoice:
    """One layer-level choice standing for ``choice``'s head groups on a target with one setting per layer.

    ``full`` when a group keeps everything (``full``, or a budget at least ``context_len``); when every
    group is ``streaming_llm``, one window keeping every group's tokens (the most sinks, the longest
    recent part); otherwise the largest group's pattern at its budget, which the caller then maps as
    any scored layer (a sliding window of that budget)."""
    groups = choice.head_groups or ()
    if any(g.pattern == "full" or g.budget >= context_len for g in groups):
        return LayerChoice("full", None)
    if all(g.pattern == "streaming_llm" for g in groups):
        sinks = [min(n_sink_of(LayerChoice(g.pattern, g.budget, g.params)), g.budget) for g in groups]
        recent = max(g.budget - n for g, n in zip(groups, sinks))
        return LayerChoice("streaming_llm", max(sinks) + recent, {"n_sink": max(sinks)})
    largest = max(groups, key=lambda g: g.budget)
    return LayerChoice(largest.pattern, largest.budget, largest.params)


def _covered(choice: LayerChoice, layer: int, phase: str, strategy: Strategy, target: str, issues: list) -> LayerChoice:
    """``choice``, or for head groups their cover (:func:`cover_head_groups`) and an issue saying so."""
    if not choice.has_head_groups:
        return choice
    cover = cover_head_groups(choice, int(strategy.context_len))  # type: ignore[arg-type]
    assert choice.budget is not None  # a Strategy sets a head-group layer's budget: its heads' mean
    holds = "every token" if cover.budget is None else f"{cover.budget} tokens"
    issues.append(
        _Issue(
            layer,
            f"layer {layer} ({phase} head groups {choice.label()}): {target} has one setting per layer for all heads",
            f"layer {layer}: {phase} head groups {choice.label()} -> {describe(cover)} for every head "
            f"(each head holds {holds}, the groups' mean {float(choice.budget):.4g})",
        )
    )
    return cover


def check_issues(issues: list[_Issue], *, fmt: str, approximate: bool) -> list[str]:
    """Refuse on the first issue (naming how many more) unless ``approximate``; else list the changes."""
    if not issues:
        return []
    issues = sorted(issues, key=lambda x: x.layer)
    if not approximate:
        first = issues[0]
        more = len({x.layer for x in issues} - {first.layer})
        tail = f"; {more} more layer{'s' if more != 1 else ''} cannot be expressed either" if more else ""
        raise ExportError(
            f"{fmt} cannot express {first.refusal}{tail}. Pass --approximate to change such layers "
            "(it prints every change), or use --format kvpress"
        )
    return [x.change for x in issues]


def _window_key(choice: LayerChoice) -> tuple:
    if choice.pattern == "full" or choice.budget is None:
        return ("full",)
    if choice.pattern == "streaming_llm":
        return ("window", choice.budget, n_sink_of(choice))
    return ("other", choice.budget, choice.pattern, tuple(sorted(dict(choice.params).items())))


def most_common(values: list[int]) -> int:
    """The most frequent value; ties go to the larger one."""
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v))


def header_lines(strategy: Strategy) -> list[str]:
    """Provenance lines every exported file starts with (as comments where the format allows)."""
    prov = strategy.provenance
    B = "none (FullKV)" if strategy.global_budget is None else f"{strategy.global_budget:g}"
    bits = [f"strategy {strategy.digest()}", f"{strategy.num_layers} layers", f"B = {B}", f"b_min = {strategy.b_min}"]
    if prov.get("solver"):
        bits.append(f"solver {prov['solver']}")
    if prov.get("model"):
        bits.append(f"model {prov['model']}")
    return [", ".join(bits)]


__all__ = [
    "EXPORTERS",
    "Export",
    "ExportError",
    "ExportOptions",
    "Exporter",
    "WindowLayer",
    "export_strategy",
    "get_exporter",
    "list_formats",
    "render_export",
    "window_plan",
    "write_export",
]
