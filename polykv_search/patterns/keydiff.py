"""KeyDiff: keep the keys least similar to the cache's mean key direction.

Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
Resource-Constrained Environments", 2025, https://arxiv.org/abs/2504.15364
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.state import PatternState

#: ``F.normalize``'s default: a zero vector stays zero instead of dividing by zero.
EPS = 1e-12


@dataclass(frozen=True)
class KeyDiff(Pattern):
    """Score each cached token by minus the cosine similarity of its (post-RoPE) key to the anchor,
    the mean of the L2-normalized keys of the cached real tokens, per batch row and KV head.

    Keys that point away from what the other keys share are kept; the pattern needs no attention
    statistics, so it works with any attention kernel and costs ``O(n D)`` per eviction. It has no
    parameters (kvpress's ``KeyDiffPress`` has none besides the compression ratio): no sinks and no
    recent window are protected.

    Notes
    -----
    * Padding slots (``layer.valid`` False) do not enter the anchor; their scores are irrelevant
      (padding is never kept ahead of a real token).
    * The anchor is the mean of the normalized keys (not the normalized mean), as in the paper and
      kvpress; a key of norm below ``1e-12`` normalizes to zero, as in ``torch.nn.functional.normalize``.
    * In decoding, each eviction rescoring the whole cache is the paper's block-wise iterative
      eviction with a block of ``decode_interval`` tokens (1 by default); in prefill, the whole
      prompt is one block (kvpress's ``KeyDiffPress`` without ``BlockPress``).
    * Checked against kvpress 0.5.5's ``KeyDiffPress`` on SmolLM2 (``scripts/verify_kvpress_patterns.py``):
      the same kept set in every (layer, KV head) after prefill, 1,620 of 1,620 (3 prompts of 512
      tokens, 30 layers, 3 KV heads, compression ratios 0.1 to 0.97). Both select per KV head; kvpress's
      ``topk`` and the stable top-``b`` here could order exact ties differently, which did not occur.
    """

    name: ClassVar[str] = "keydiff"

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        keys = layer.keys.float()
        norm = keys.norm(dim=-1).clamp_min(EPS)  # [B, Hkv, n]
        unit = keys / norm[..., None]
        if layer.all_valid:
            anchor = unit.mean(dim=-2)  # [B, Hkv, D]
        else:
            weight = layer.valid.to(unit.dtype)
            count = weight.sum(dim=-1, keepdim=True).clamp_min(1.0)
            anchor = torch.einsum("bhn,bhnd->bhd", weight, unit) / count
        anchor_norm = anchor.norm(dim=-1, keepdim=True).clamp_min(EPS)  # [B, Hkv, 1]
        cosine = torch.einsum("bhnd,bhd->bhn", unit, anchor) / anchor_norm
        return -cosine
