"""The checks of ``scripts/verify_kvpress_patterns.py``: which kvpress press, with which arguments, each of our
patterns (with which parameters) is compared with, and how kvpress's kept positions are read."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Press:
    """How one of our patterns maps to a kvpress press, in one check."""

    press: str  # class name in ``kvpress``
    kwargs: dict = field(default_factory=dict)  # besides compression_ratio
    params: dict = field(default_factory=dict)  # our pattern's parameters
    kept: str = "cache"  # how kvpress's kept positions are read: "cache" or "masked"
    pattern: str = ""  # our pattern (default: the check's name)
    setup: dict = field(default_factory=dict)  # press attributes set once its context is entered
    chat_prefix: bool = False  # prompts start with the chat template's prefix, as kvpress's pipeline feeds them
    same: bool = True  # expected to keep the same sets (decides the exit status)
    note: str = ""


#: KVzipPress computes ``prefix_length`` (the chat template's prefix, which its pass neither repeats nor
#: scores) from the tokenizer when its context is entered; the like-for-like checks feed the raw prompt,
#: so they set it to 0 before the prefill: the whole prompt is then repeated and scored, as ours does.
_RAW = {"prefix_length": 0}
PRESSES: dict[str, Press] = {
    "keydiff": Press("KeyDiffPress"),
    "expected_attention": Press("ExpectedAttentionPress"),
    "kvzip": Press(
        "KVzipPress",
        {"layerwise": True},
        kept="masked",
        setup=_RAW,
        note="layerwise=True (each layer drops int(Hkv*n*ratio) tokens over its heads), raw prompt",
    ),
    "kvzip-layer": Press(
        "KVzipPress",
        {"layerwise": True},
        {"allocation": "layer"},
        kept="masked",
        pattern="kvzip",
        setup=_RAW,
        note="allocation='layer' against layerwise=True: both rank a layer's heads together",
    ),
    "kvzip-model": Press(
        "KVzipPress",
        {"layerwise": False},
        {"allocation": "model"},
        kept="masked",
        pattern="kvzip",
        setup=_RAW,
        note="allocation='model' against kvpress's default: both rank all layers and heads together",
    ),
    "kvzip-global": Press(
        "KVzipPress",
        {"layerwise": False},
        kept="masked",
        pattern="kvzip",
        setup=_RAW,
        same=False,
        note="kvpress's default layerwise=False: the lowest scores over all layers and heads",
    ),
    "kvzip-chunked": Press(
        "KVzipPress",
        {"layerwise": True, "chunk_size": 128},
        {"chunk_size": 128},
        kept="masked",
        pattern="kvzip",
        setup=_RAW,
        same=False,
        note="chunk_size=128 on both sides",
    ),
    "kvzip-plus": Press(
        "KVzipPress",
        {"layerwise": True, "kvzip_plus_normalization": True},
        {"plus": True},
        kept="masked",
        pattern="kvzip",
        setup=_RAW,
        note="plus=true against kvzip_plus_normalization=True (KVzip+), layerwise=True, raw prompt",
    ),
    "kvzip-plus-model": Press(
        "KVzipPress",
        {"layerwise": False, "kvzip_plus_normalization": True},
        {"plus": True, "allocation": "model"},
        kept="masked",
        pattern="kvzip",
        setup=_RAW,
        note="KVzip+ with allocation='model' against kvpress's default: the normalized scores ranked over all layers",
    ),
    "kvzip-template": Press(
        "KVzipPress",
        {"layerwise": True},
        kept="masked",
        pattern="kvzip",
        chat_prefix=True,
        same=False,
        note="the chat template's prefix + the prompt, kvpress's own prefix_length",
    ),
}
