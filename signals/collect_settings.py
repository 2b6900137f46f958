"""Collection settings: the grid, the method, the signal definitions, and their validation."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polykv_search.data.evidence import scored_span
from polykv_search.patterns import canonical_spec
from signals.uncertainty import DEFAULT_BLOCKS
from strategies import PHASES

#: expected_attention earns its cells (the best prefill cell in 5-8 of SmolLM2's 30 layers); keydiff, rarely
#: the best cell anywhere, is left out (docs/calibration.md, "Query-agnostic patterns in the grid"). evidence
#: (half the budget for the prompt's best tokens, the rest tova) is there so that solves can choose a decoding
#: plan that keeps the prompt (docs/decode.md, "Decoding plans that keep the prompt's evidence").
DEFAULT_PATTERNS: tuple[str, ...] = (
    "snapkv",
    "tova",
    "h2o",
    "streaming_llm",
    "knorm",
    "random",
    "expected_attention",
    "evidence",
)
DEFAULT_BUDGETS: tuple[int, ...] = (32, 64, 128, 256)

#: Bumped whenever what a cell's numbers mean changes; part of the journal key.
DEFINITIONS_VERSION = 2
DEFINITIONS = {
    "cosine": "mean over the scored continuation positions of cos(layer-l output with the cell, with "
    "FullKV); mean over samples",
    "dppl": "exp(mean over samples of the mean NLL of each sample's scored continuation tokens with "
    "the cell) - exp(same "
    "under FullKV); the pooled token PPL when every sample scores all m tokens",
    "scored": "the continuation tokens a sample's cell signals (cosine, NLL, KL) average over: all m "
    "of a prose sample; "
    "only the answer tokens of a retrieval (evidence) sample, whose query and following prose need no evidence; every "
    "token is still run, teacher-forced, under the cell",
    "kl": "mean over the scored continuation positions of KL(FullKV || cell) of the next-token "
    "distributions (0 at the first "
    "position, which the context predicts); mean over samples; >= 0",
    "se": "cluster-robust standard error over (sample, token block) units: each sample's scored tokens cut into "
    "`blocks` contiguous blocks, weighted so that every sample counts equally; dPPL by the delta method, "
    "PPL(cell) * SE(paired mean NLL difference); t with se_dof = units - 1",
    "entropy": "FullKV attention entropy / log(#visible keys), mean over heads and the phase's queries "
    "(prefill: prompt queries; decoding: continuation queries, teacher-forced)",
    "variance": "sum over keys of the variance over queries of FullKV attention, mean over heads "
    "(prefill: last 32 prompt queries; decoding: continuation queries)",
    "cells": "only layer l evicts; prefill: prompt cache compressed to b after the prompt's attention, continuation "
    "teacher-forced in one call; decoding: FullKV prompt, capacity b kept while the continuation is teacher-forced "
    "one token per step",
}


class CollectError(ValueError):
    """Bad collection input, or a journal that cannot be continued (one line)."""


@dataclass(frozen=True)
class CollectSettings:
    """The grid and method (picklable: sent to workers)."""

    patterns: tuple[str, ...]
    budgets: tuple[int, ...]
    phases: tuple[str, ...]
    layers: tuple[int, ...]
    naive: bool = False
    batch_tokens: int = 8192
    blocks: int = DEFAULT_BLOCKS

    @property
    def cells_per_unit(self) -> int:
        return len(self.patterns) * len(self.budgets)


@dataclass(frozen=True)
class Unit:
    sample: int
    layer: int
    phase: str


def parse_layers(text: str | None, num_layers: int) -> tuple[int, ...]:
    """``None``/``"all"`` → every layer; else ``"0,5,10-12"`` (ranges inclusive)."""
    if text is None or str(text).strip() in ("", "all"):
        return tuple(range(num_layers))
    layers: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                layers.update(range(lo, hi + 1))
            else:
                layers.add(int(part))
        except ValueError:
            raise CollectError(f"layers: cannot read {part!r} (expected e.g. 0,5,10-12)") from None
    bad = sorted(x for x in layers if not 0 <= x < num_layers)
    if bad or not layers:
        raise CollectError(f"layers: {bad or text!r} out of range [0, {num_layers})")
    return tuple(sorted(layers))


def make_settings(
    num_layers: int, *, patterns, budgets, phases, layers, naive: bool, batch_tokens: int, blocks: int = DEFAULT_BLOCKS
) -> CollectSettings:
    patterns = tuple(patterns)
    if not patterns:
        raise CollectError("patterns: give at least one")
    try:  # a pattern with parameters is a column of its own, named canonically (kvzip[allocation=model])
        patterns = tuple(canonical_spec(p) for p in patterns)
    except ValueError as err:
        raise CollectError(f"patterns: {err}") from None
    if len(set(patterns)) != len(patterns):
        raise CollectError(f"patterns: duplicates in {list(patterns)}")
    try:
        budgets = tuple(sorted(int(b) for b in budgets))
    except (TypeError, ValueError):
        raise CollectError(f"budgets: not integers: {budgets!r}") from None
    if not budgets or budgets[0] < 1 or len(set(budgets)) != len(budgets):
        raise CollectError(f"budgets: need distinct positive integers, got {list(budgets)}")
    phases = tuple(phases)
    bad = [p for p in phases if p not in PHASES]
    if not phases or bad or len(set(phases)) != len(phases):
        raise CollectError(f"phases: choose distinct values from {', '.join(PHASES)}, got {list(phases)}")
    phases = tuple(p for p in PHASES if p in phases)
    if isinstance(layers, str) or layers is None:
        layers = parse_layers(layers, num_layers)
    else:
        layers = parse_layers(",".join(str(int(x)) for x in layers), num_layers)
    if batch_tokens < 1:
        raise CollectError("batch_tokens must be positive")
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise CollectError(f"blocks: token blocks per continuation must be a positive integer, got {blocks!r}")
    return CollectSettings(patterns, budgets, phases, layers, bool(naive), int(batch_tokens), int(blocks))


def scored_spans(samples: Sequence[Any], m: int) -> list[tuple[int, int]]:
    """Each sample's scored continuation positions ``[start, end)`` (all m tokens unless the sample
    says otherwise: :func:`polykv_search.data.evidence.scored_span`), checked."""
    spans = [scored_span(s) for s in samples]
    for i, (a, b) in enumerate(spans):
        if not 0 <= a < b <= m:
            raise CollectError(
                f"samples: sample {i}'s scored positions [{a}, {b}) are not a non-empty part of its "
                f"{m}-token continuation"
            )
    return spans


def scored_key(calibration: str, spans: Sequence[tuple[int, int]], m: int) -> dict[str, Any]:
    """What the scored positions add to the collection key: nothing for prose-only calibration (old
    journals and tables keep their key); else the spans, and a calibration fingerprint that covers
    them (so a journal of other spans is refused as another calibration set)."""
    if all(tuple(sp) == (0, m) for sp in spans):
        return {}
    scored = [list(sp) for sp in spans]
    return {"scored": scored, "calibration": hashlib.sha256(f"{calibration}:{scored}".encode()).hexdigest()[:16]}
