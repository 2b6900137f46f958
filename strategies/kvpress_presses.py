"""The kvpress side of ``--format kvpress``: which kvpress press stands for each pattern.

Shared by the exporter (:mod:`strategies.export_kvpress`, the Python module it writes) and the
sidecar (:mod:`strategies.kvpress_sidecar`, the JSON beside it), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from strategies.catalog import make_pattern
from strategies.exporters import ExportError
from strategies.pattern_spec import param_text
from strategies.strategy import LayerChoice

KVPRESS_REQUIREMENT = "kvpress>=0.5,<0.6"
SIDECAR_SCHEMA = "polykv-kvpress-export"
#: decoding steps between two compressions of a layer over its decoding budget
DECODING_INTERVAL = 1

_NO_DECODING_H2O = (
    "dropped: kvpress has no decoding counterpart of H2O's attention accumulated over all steps "
    "(ObservedAttentionPress only sees one step); the layer keeps every generated token"
)
_NO_DECODING_SNAPKV = (
    "dropped: kvpress's SnapKVPress cannot score while decoding (it needs more buffered queries than "
    "its window, with their positions); the layer keeps every generated token"
)

_NO_DECODING_EXPECTED_ATTENTION = (
    "dropped: kvpress's DecodingPress hands ExpectedAttentionPress only the hidden states buffered since its "
    "last compression (one per step here, which its n_sink cut leaves empty) and rotates ahead from the buffer "
    "length instead of the sequence position; the layer keeps every generated token"
)

_NO_DECODING_KVZIP = (
    "dropped: kvpress's KVzipPress compresses the prompt only (a reconstruction pass has no meaning "
    "mid-decoding); the layer keeps every generated token"
)


def _with_evidence(press: Press, p: dict[str, Any]) -> Press:
    """The inner rule's press of an ``evidence`` pattern, its share named among the differences."""
    if not p["share"]:
        return press
    why = (
        f"share={p['share']} is not applied: kvpress has no press that keeps a share of the budget for the prompt's "
        f"best tokens beside another rule; the whole budget follows {p['rule']}"
    )
    return replace(press, differences=press.differences + (why,))


@dataclass(frozen=True)
class Press:
    """A kvpress press class, its constructor arguments and what it does differently."""

    cls: str
    params: dict[str, Any]
    differences: tuple[str, ...] = ()


def pattern_params(choice: LayerChoice) -> dict[str, Any]:
    return make_pattern(choice.pattern, **dict(choice.params)).params()


def prefill_press(choice: LayerChoice) -> Press | None:
    """The kvpress press that compresses the prompt like ``choice`` (None: keep every token)."""
    if choice.pattern == "full" or choice.budget is None:
        return None
    p = pattern_params(choice)
    name = choice.pattern
    if name == "streaming_llm":
        return Press("StreamingLLMPress", {"n_sink": p["n_sink"]})
    if name == "h2o":
        return Press(
            "ObservedAttentionPress",
            {},
            (
                "ObservedAttentionPress scores by the attention each token received from the prompt "
                "(averaged over the queries that see it; needs attn_implementation='eager') and "
                f"protects no recent window (recent_ratio={p['recent_ratio']} is not applied)",
            ),
        )
    if name == "tova":
        return Press("TOVAPress", {}, ("kvpress always keeps the newest token",))
    if name in ("snapkv", "pyramidkv"):
        diffs = []
        if name == "pyramidkv":
            diffs.append(
                "SnapKVPress with PyramidKV's window and kernel "
                "(kvpress's PyramidKVPress would impose its own budget schedule)"
            )
        if p["pooling"] == "maxpool":
            diffs.append("max pooling -> average pooling (kvpress's SnapKVPress only averages)")
        return Press("SnapKVPress", {"window_size": p["window"], "kernel_size": p["kernel"]}, tuple(diffs))
    if name == "knorm":
        return Press("KnormPress", {})
    if name == "keydiff":
        return Press("KeyDiffPress", {})
    if name == "expected_attention":
        return Press(
            "ExpectedAttentionPress",
            {k: p[k] for k in ("n_future_positions", "n_sink", "use_covariance", "use_vnorm", "epsilon")},
            ("kvpress estimates the query statistics in the model's dtype (polykv-search: float64 sums)",),
        )
    if name == "kvzip":
        allocation = {
            "head": ", and layerwise=True splits each layer's budget across its heads (here: each head its own top b)",
            "layer": "",  # layerwise=True ranks a layer's heads together, as allocation='layer' does
            "model": ", and layerwise=True ranks each layer's heads alone (here allocation='model' ranks every "
            "such layer together, as one KVzipPress(layerwise=False) over the whole model does)",
        }[p.get("allocation", "head")]
        diffs = [
            "kvpress's KVzipPress runs its own reconstruction pass: the softmax of a chunk's queries covers "
            "the sinks, that chunk and the repeat tokens only (polykv-search: the whole cache; the same for "
            "prompts of one chunk); its pass neither repeats nor scores the chat template's prefix (evicted "
            f"first past the n_sink={p['n_sink']} sinks){allocation}"
        ]
        if p.get("boundary", 0):
            diffs.append(
                f"boundary={p['boundary']} is not applied: KVzipPress protects no prompt-boundary tokens "
                "(only its first n_sink), so the prompt's last tokens are ranked by their scores"
            )
        if p.get("evidence", 0) and p.get("allocation", "head") != "head":
            diffs.append(
                f"evidence={p['evidence']} is not applied: KVzipPress keeps no per-head share of each head's best "
                "prompt tokens ahead of its pooled ranking"
            )
        prior = {k: p[k] for k, plain in (("weight", 1.0), ("floor", 0), ("cap", 0)) if p.get(k, plain) != plain}
        if prior:
            text = ", ".join(f"{k}={param_text(v)}" for k, v in prior.items())
            diffs.append(
                f"the pool prior {text} is not applied: KVzipPress "
                "ranks every layer's scores as they are, with no per-layer or per-head weight, floor or cap"
            )
        params = {"layerwise": True, "n_sink": p["n_sink"]}  # kvpress's n_sink: the first tokens always kept
        if p.get("plus"):
            params["kvzip_plus_normalization"] = True
        return Press("KVzipPress", params, tuple(diffs))
    if name == "evidence":
        inner = prefill_press(LayerChoice(p["rule"], choice.budget))
        assert inner is not None
        return _with_evidence(inner, p)
    if name == "random":
        return Press(
            "RandomPress", {"seed": p["seed"]}, ("kvpress draws its own random numbers (same seed, other tokens)",)
        )
    # every registered pattern is mapped above (tests/test_registries.py checks each one)
    raise ExportError(f"kvpress has no counterpart for pattern {name!r}")  # pragma: no cover


def decoding_press(choice: LayerChoice) -> tuple[Press | None, str | None]:
    """The scorer a DecodingPress wraps for ``choice``, or (None, why it is dropped / None if nothing to do)."""
    if choice.pattern == "full" or choice.budget is None:
        return None, None
    if choice.pattern == "h2o":
        return None, _NO_DECODING_H2O
    if choice.pattern in ("snapkv", "pyramidkv"):
        return None, _NO_DECODING_SNAPKV
    if choice.pattern == "expected_attention":
        return None, _NO_DECODING_EXPECTED_ATTENTION
    if choice.pattern == "kvzip":
        return None, _NO_DECODING_KVZIP
    if choice.pattern == "evidence":
        p = pattern_params(choice)
        inner, dropped = decoding_press(LayerChoice(p["rule"], choice.budget))
        if inner is None:
            return None, dropped
        return _with_evidence(inner, p), None
    press = prefill_press(choice)
    assert press is not None
    return press, None
