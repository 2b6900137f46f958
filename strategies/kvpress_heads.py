"""Head groups in ``--format kvpress``: which KV heads of a layer keep which keys, as kvpress key masks.

kvpress (0.5.x) has no press that evicts different tokens per KV head: its head-wise presses
(``DuoAttentionPress``, ``AdaKVPress``) keep every key in the cache and *mask* the evicted ones per
(batch row, KV head, position) through ``module.masked_key_indices``, which kvpress's attention patch
(``kvpress.attention_patch``, installed on import for every registered attention function except eager)
replaces by a fake key whose attention weight underflows to zero in every later call. The exported
module uses that same mechanism for the layers with head groups, after every attention call of the
layer (prefill and decoding), so the masks follow polykv-search's eviction rule (decoding interval 1):

* ``full`` (or a group without a budget): nothing is masked;
* ``streaming_llm``: of the keys the head still sees, the first ``n_sink`` and the last
  ``budget - n_sink`` stay visible, in prefill and after every decoding call; exact (the same keys as
  the runtime keeps), a duo-shaped strategy included;
* another pattern in **prefill**: its kvpress scorer press (:func:`strategies.kvpress_presses.prefill_press`)
  scores the keys and each head keeps its own top ``budget``: the group's budget per head exactly, with
  the scorer's listed differences (as for layer-level choices);
* another pattern in **decoding**: kvpress cannot evict by score per head while decoding (its
  ``DecodingPress`` compresses whole layers), so such heads would keep every generated token. That
  changes results: refused in one line unless ``--approximate``, which lets them keep every generated
  token and lists each such group;
* ``h2o`` and ``kvzip`` groups are refused even with ``--approximate``: ``ObservedAttentionPress`` needs
  eager attention, where kvpress's key masking does not apply, and ``KVzipPress`` runs its own
  reconstruction pass over whole layers.

What is approximated whatever the strategy (notes of the export, they do not change which keys a head
attends to): **memory is not freed** (a head-group layer holds every token, as kvpress's
DuoAttentionPress and AdaKVPress do: "does not reduce peak memory"); a masked key's weight is
exp(fake score), zero up to floating point, not a removed key; masks are per tensor index, so batch
size 1 without padding; eager attention is not supported.

A *duo-shaped* strategy (every layer: the same heads in both phases, each ``full`` or ``streaming_llm``,
every streaming head with one ``n_sink`` and one budget above it) also gets ``duo_attention_press()``:
kvpress's own ``DuoAttentionPress`` with the strategy's streaming heads (``streaming_mask``),
``sink_size = n_sink`` and ``recent_size = budget - n_sink`` instead of its published patterns or its
on-the-fly scoring. It is prefill-only (kvpress does not update its masks while decoding: a streaming
head then sees every generated token besides its sinks and recent prompt tokens), so ``make_press()``
(exact in both phases) is the export's press and this one is for comparisons with kvpress's
DuoAttention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strategies.exporters import ExportError, describe
from strategies.kvpress_presses import Press, pattern_params, prefill_press
from strategies.strategy import PHASES, LayerChoice, Strategy

#: patterns a head group cannot have in a kvpress export, with the reason
_NEVER = {
    "h2o": "kvpress's ObservedAttentionPress needs eager attention, where its per-head key masking does not apply",
    "kvzip": "kvpress's KVzipPress runs its own reconstruction pass over whole layers",
}
KEEPS_GENERATED = "keeps every generated token (kvpress cannot evict by score per head while decoding)"


@dataclass(frozen=True)
class GroupRule:
    """What the exported module does for one head group in one phase."""

    heads: tuple[int, ...]
    kind: str  #: "full", "streaming", or a kvpress scorer press class (top ``budget`` by its score)
    params: dict[str, Any]
    budget: int | None
    source: str  #: the strategy's group, for comments
    differences: tuple[str, ...] = ()

    def row(self) -> tuple:
        return (self.heads, self.kind, self.params, self.budget)


@dataclass
class HeadPlan:
    """Per layer None (a layer-level choice in both phases) or ``{phase: [GroupRule, ...]}``."""

    layers: list[dict[str, list[GroupRule]] | None]
    warnings: list[str]
    duo: dict[str, Any] | None  #: sink_size, recent_size, streaming [L][H] for duo_attention_press()

    @property
    def any(self) -> bool:
        return any(x is not None for x in self.layers)


def _groups(choice: LayerChoice, num_kv_heads: int) -> list[tuple[tuple[int, ...], LayerChoice]]:
    """A phase's choice as ``(heads, layer-level choice)`` per group (one group of every head if none)."""
    if not choice.has_head_groups:
        return [(tuple(range(num_kv_heads)), choice)]
    return [(g.heads, LayerChoice(g.pattern, g.budget, dict(g.params))) for g in choice.head_groups or ()]


def _rule(layer: int, phase: str, heads, choice: LayerChoice, approximate: bool, warnings: list[str]) -> GroupRule:
    where = f"layer {layer} {phase} KV heads {list(heads)} ({describe(choice)})"
    if choice.pattern == "full" or choice.budget is None:
        return GroupRule(heads, "full", {}, None, describe(choice))
    if choice.pattern in _NEVER:
        raise ExportError(f"kvpress cannot express {where}: {_NEVER[choice.pattern]}; use --format json")
    if choice.pattern == "streaming_llm":
        n_sink = int(pattern_params(choice)["n_sink"])
        return GroupRule(heads, "streaming", {"n_sink": n_sink}, int(choice.budget), describe(choice))
    if phase == "decoding":
        if not approximate:
            raise ExportError(
                f"kvpress cannot express {where}: kvpress evicts by score per head only in prefill (key masks), "
                "so these heads would keep every generated token. Pass --approximate to allow that (it prints "
                "every change), or use --format json"
            )
        warnings.append(f"{where}: {KEEPS_GENERATED}")
        return GroupRule(heads, "full", {}, None, f"{describe(choice)}, approximated: {KEEPS_GENERATED}")
    press: Press | None = prefill_press(choice)
    assert press is not None
    return GroupRule(heads, press.cls, dict(press.params), int(choice.budget), describe(choice), press.differences)


def head_plan(strategy: Strategy, approximate: bool) -> HeadPlan:
    """The head-group layers of ``strategy`` as mask rules (module docstring); :class:`ExportError` on
    the first group kvpress cannot express (or only approximately, without ``approximate``)."""
    H = strategy.num_kv_heads or 0
    layers: list[dict[str, list[GroupRule]] | None] = []
    warnings: list[str] = []
    for i, (pre, dec) in enumerate(zip(strategy.prefill, strategy.decoding)):
        if not (pre.has_head_groups or dec.has_head_groups):
            layers.append(None)
            continue
        layers.append(
            {
                phase: [_rule(i, phase, heads, c, approximate, warnings) for heads, c in _groups(choice, H)]
                for phase, choice in zip(PHASES, (pre, dec))
            }
        )
    plan = HeadPlan(layers, warnings, None)
    plan.duo = _duo_shape(strategy, plan) if plan.any and not warnings else None
    return plan


def _per_head(rules: Sequence[GroupRule], H: int) -> list[tuple]:
    out: list[tuple] = [()] * H
    for r in rules:
        for h in r.heads:
            out[h] = (r.kind, r.params.get("n_sink"), r.budget)
    return out


def _duo_shape(strategy: Strategy, plan: HeadPlan) -> dict[str, Any] | None:
    """``{sink_size, recent_size, streaming}`` when the strategy is duo-shaped (module docstring), else None."""
    H = strategy.num_kv_heads or 0
    streaming: list[list[bool]] = []
    shapes = set()
    for i, rules in enumerate(plan.layers):
        if rules is None:  # a layer-level choice: duo-shaped when full or streaming_llm in both phases
            c = strategy.prefill[i]
            if c.pattern not in ("full", "streaming_llm") or strategy.decoding[i] != c:
                return None
            rules = {p: [_rule(i, p, tuple(range(H)), c, False, [])] for p in PHASES}
        pre, dec = (_per_head(rules[p], H) for p in PHASES)
        if pre != dec or any(k not in ("full", "streaming") for k, _, _ in pre):
            return None
        shapes |= {(n_sink, budget) for k, n_sink, budget in pre if k == "streaming"}
        streaming.append([k == "streaming" for k, _, _ in pre])
    if len(shapes) > 1:
        return None
    n_sink, budget = shapes.pop() if shapes else (0, 1)
    if budget <= n_sink:  # kvpress masks [sink_size:-recent_size], empty with recent_size 0
        return None
    return {"sink_size": n_sink, "recent_size": budget - n_sink, "streaming": streaming}


# ----------------------------------------------------------------------------- the exported module's parts
def table_rows(strategy: Strategy, plan: HeadPlan) -> str:
    """The ``HEAD_GROUPS`` table of the module, one entry per layer."""
    rows = []
    for i, rules in enumerate(plan.layers):
        if rules is None:
            rows.append(f"    None,  # layer {i}: layer-level (PREFILL, DECODING)")
            continue
        rows.append("    {")
        for phase in PHASES:
            rows.append(f"        {phase!r}: [")
            for r in rules[phase]:
                rows.append(f"            {r.row()!r},  # {r.source}")
            rows.append("        ],")
        rows.append(f"    }},  # layer {i}")
    return "\n".join(rows)


def sidecar_layer(strategy: Strategy, layer: int, rules: dict[str, list[GroupRule]]) -> dict[str, Any]:
    """A head-group layer in the sidecar: per phase, each group's choice and its kvpress key-mask rule."""
    out: dict[str, Any] = {"layer": layer}
    for phase, choice in zip(PHASES, (strategy.prefill[layer], strategy.decoding[layer])):
        groups = []
        for r in rules[phase]:
            groups.append(
                {
                    "heads": list(r.heads),
                    "strategy": r.source,
                    "kvpress": {"mask": r.kind, "params": r.params, "budget": r.budget},
                    "differences": list(r.differences),
                }
            )
        out[phase] = {"head_groups": groups, "budget": choice.budget}
    return out


#: the parts a strategy without head groups leaves out of the module (its text stays as before)
NO_PARTS = dict.fromkeys(
    ("doc", "imports", "tables", "fields", "post_init", "post_init_model", "route", "method", "tail"), ""
)

_DOC = """
Head groups (HEAD_GROUPS): a layer with head groups holds every token and hides, per KV head, the
keys its group evicts through kvpress's key masks (module.masked_key_indices, the mechanism of
kvpress's DuoAttentionPress and AdaKVPress), updated after every attention call of the layer:
streaming heads see their first n_sink keys and the last budget - n_sink (exactly the keys
polykv-search keeps, prefill and decoding); scorer groups keep, per head, the budget keys their
kvpress press scores highest (prefill); full heads see everything. No memory is freed, and it needs
batch size 1 without padding and attn_implementation 'sdpa' or 'flash_attention_2' (kvpress does
not patch eager attention).
"""

_HELPERS = """

#: per layer: None (PREFILL and DECODING route it), or per phase the layer's head groups as
#: (KV heads, "full" | "streaming" | kvpress scorer press, its parameters, budget per head)
HEAD_GROUPS = [
{rows}
]


def keep_streaming(visible, n_sink, budget):
    \"\"\"Of the keys each head still sees, the first n_sink and the last budget - n_sink (streaming_llm).\"\"\"
    rank = visible.cumsum(-1) - 1
    count = visible.sum(-1, keepdim=True)
    n_sink = min(n_sink, budget)
    return visible & ((rank < n_sink) | (rank >= count - (budget - n_sink)))


def keep_top(visible, scores, budget):
    \"\"\"Of the keys each head still sees, the budget with the highest score.\"\"\"
    scores = scores.float().masked_fill(~visible, float("-inf"))
    top = scores.topk(min(budget, scores.shape[-1]), dim=-1).indices
    return visible & torch.zeros_like(visible).scatter(-1, top, True)"""

_FIELDS = """
    head_scorers: dict = field(default_factory=dict, init=False, repr=False)"""

_POST_INIT = """
        self.head_scorers = {
            (i, phase, j): getattr(kvpress, group[1])(**group[2])
            for i, layer in enumerate(HEAD_GROUPS)
            if layer is not None
            for phase, groups in layer.items()
            for j, group in enumerate(groups)
            if group[1] not in ("full", "streaming")
        }"""

_POST_INIT_MODEL = """
        for scorer in self.head_scorers.values():
            scorer.post_init_from_model(model)"""

_ROUTE = """
        if HEAD_GROUPS[i] is not None:
            return self.mask_heads(module, kwargs, output)"""

_METHOD = """

    def mask_heads(self, module, kwargs, output):
        \"\"\"Hide, per KV head, the keys its head group evicts (kvpress masks them in every later call).\"\"\"
        i = module.layer_idx
        layer = kwargs["past_key_values"].layers[i]
        prefill = is_prefill(kwargs)
        visible = torch.ones(layer.keys.shape[:3], dtype=torch.bool, device=layer.keys.device)
        held = None if prefill else getattr(module, "polykv_visible", None)
        if held is not None:
            n = min(held.shape[-1], visible.shape[-1])
            visible[..., :n] = held[..., :n]
        phase = "prefill" if prefill else "decoding"
        for j, (heads, kind, params, budget) in enumerate(HEAD_GROUPS[i][phase]):
            h = list(heads)
            if kind == "streaming":
                visible[:, h] = keep_streaming(visible[:, h], params["n_sink"], budget)
            elif kind != "full":
                scorer = self.head_scorers[(i, phase, j)]
                scores = scorer.score(module, kwargs["hidden_states"], layer.keys, layer.values, output[1], kwargs)
                visible[:, h] = keep_top(visible[:, h], scores[:, h], budget)
        module.polykv_visible = visible
        module.masked_key_indices = None if bool(visible.all()) else torch.nonzero(~visible, as_tuple=True)
        return output"""

_DUO = """


#: this strategy as kvpress's DuoAttentionPress takes it: its streaming KV heads [layer][head], one
#: sink_size and recent_size (the strategy is duo-shaped)
DUO_ATTENTION = {duo}


class StrategyDuoAttentionPress(kvpress.DuoAttentionPress):
    \"\"\"kvpress's DuoAttentionPress with this strategy's streaming heads, sink and recent sizes, instead of
    DuoAttention's published patterns or kvpress's on-the-fly scoring. Prefill only: kvpress does not move
    its masks while decoding, so a streaming head then also sees every generated token (make_press() is
    exact in both phases).\"\"\"

    def post_init_from_model(self, model):
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if config.num_hidden_layers != NUM_LAYERS:
            raise ValueError(
                f"this press was exported for {{NUM_LAYERS}} layers; the model has {{config.num_hidden_layers}}"
            )
        self.sink_size = DUO_ATTENTION["sink_size"]
        self.recent_size = DUO_ATTENTION["recent_size"]
        self.streaming_mask = torch.tensor(DUO_ATTENTION["streaming"], dtype=torch.bool, device=model.device)


def duo_attention_press() -> StrategyDuoAttentionPress:
    streaming = DUO_ATTENTION["streaming"]
    share = sum(map(sum, streaming)) / sum(map(len, streaming))
    return StrategyDuoAttentionPress(head_compression_ratio=share)"""


def module_parts(strategy: Strategy, plan: HeadPlan) -> dict[str, str]:
    """The text the exported module gets for head groups (:data:`NO_PARTS` when it has none)."""
    if not plan.any:
        return dict(NO_PARTS)
    duo = ""
    doc = _DOC
    if plan.duo is not None:
        duo = _DUO.format(duo=repr(plan.duo))
        doc += (
            "\nduo_attention_press(): kvpress's own DuoAttentionPress with this strategy's streaming heads,\n"
            "sink and recent sizes (prefill only: its streaming heads see every generated token).\n"
        )
    return {
        "doc": doc,
        "imports": "\nimport torch",
        "tables": _HELPERS.format(rows=table_rows(strategy, plan)),
        "fields": _FIELDS,
        "post_init": _POST_INIT,
        "post_init_model": _POST_INIT_MODEL,
        "route": _ROUTE,
        "method": _METHOD,
        "tail": duo,
    }


def head_notes() -> list[str]:
    """Notes of an export with head groups (true whatever the groups)."""
    return [
        "layers with head groups hold every token: kvpress masks the keys each KV head evicts (fake keys whose "
        "attention weight underflows to zero, kvpress's attention patch) instead of freeing them, so they save "
        "no memory; use attn_implementation 'sdpa' or 'flash_attention_2' (kvpress does not patch eager) and "
        "batch size 1 without padding (masks are per tensor index)"
    ]


__all__ = [
    "KEEPS_GENERATED",
    "NO_PARTS",
    "GroupRule",
    "HeadPlan",
    "head_notes",
    "head_plan",
    "module_parts",
    "sidecar_layer",
    "table_rows",
]
