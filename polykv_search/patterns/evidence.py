"""Evidence: a share of the budget kept for the prompt's best tokens, the rest following a decoding rule.

A decoding pattern that follows the generation alone (a recent window, TOVA, H2O) loses the facts the prompt
gave once the generation is longer than its budget. This pattern scores the prompt once, as SnapKV does, by
the attention the prompt's last ``window`` queries (where a question or an instruction usually sits) give it
(Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", NeurIPS 2024,
https://arxiv.org/abs/2404.14469), keeps the best of it for good, and hands the rest of the budget to the
inner ``rule``. KVzip's own prompt scores do the same through ``kvzip[evidence=...]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern
from polykv_search.patterns.h2o import H2O
from polykv_search.patterns.selection import protect_top_share
from polykv_search.patterns.snapkv import SnapKV
from polykv_search.patterns.state import PatternState, fit_tokens
from polykv_search.patterns.streaming_llm import StreamingLLM
from polykv_search.patterns.tova import TOVA

#: The inner rules, by name, with the literature's defaults.
RULES: dict[str, type[Pattern]] = {"tova": TOVA, "h2o": H2O, "streaming_llm": StreamingLLM}


@dataclass(frozen=True)
class Evidence(Pattern):
    """Keep ``floor(share * b)`` of the prompt's best tokens for good and give the rest of ``b`` to ``rule``.

    At the layer's first call (the prompt), every prompt token gets SnapKV's score: the attention of the
    prompt's last ``window`` queries, the window not voting for itself, pooled along the sequence, the GQA
    group's mean (with ``rule="tova"`` the mean over all heads, since TOVA's heads share one selection). At
    budget ``b`` a KV head then keeps the tokens ``rule`` protects at budget
    ``b - floor(share * b)`` (e.g. StreamingLLM's sinks and recent window, H2O's recent window), its
    ``floor(share * b)`` best-scored prompt tokens outside them (the *evidence*), and the rest of ``b`` by
    ``rule``'s own score. The evidence is chosen among the prompt tokens still held at each eviction; as they
    are never evicted, they stay the same tokens, except that a prompt token inside ``rule``'s own protected
    tokens (a sink, the prompt's tail early in decoding) is not counted in the share while it is protected.

    Parameters
    ----------
    share : float
        Share of the budget, in [0, 1), kept for the prompt's evidence (0: the inner rule alone).
    rule : {"tova", "h2o", "streaming_llm"}
        The decoding rule the rest of the budget follows, with its literature defaults.
    window : int
        The prompt's last queries whose attention scores it (SnapKV's observation window).
    kernel : int
        Pooling kernel (odd) along the token axis: a fact's neighbours (the digits of a number) score together.
    pooling : {"avgpool", "maxpool"}

    Notes
    -----
    Used as a prefill pattern it compresses the prompt by the same rule (evidence share plus ``rule``).
    Per head where retrieval heads are known is not built in: a head-level strategy gives those heads
    another pattern (``full`` or a larger budget) through head groups.
    """

    name: ClassVar[str] = "evidence"
    share: float = 0.5
    rule: str = "tova"
    window: int = 32
    kernel: int = 5
    pooling: str = "avgpool"

    def __post_init__(self) -> None:
        if isinstance(self.share, bool) or not isinstance(self.share, (int, float)) or not 0 <= self.share < 1:
            raise ValueError(f"share must be a number in [0, 1), got {self.share!r}")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        self._scorer  # noqa: B018  (SnapKV checks window, kernel and pooling, naming the bad value)

    @cached_property
    def _inner(self) -> Pattern:
        return RULES[self.rule]()

    @cached_property
    def _scorer(self) -> SnapKV:
        return SnapKV(self.window, self.kernel, self.pooling)

    def pre_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        self._inner.pre_kernel(layer, state, query)

    def post_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        self._inner.post_kernel(layer, state, query)
        if "evidence" not in state.token:  # the prompt: score it once
            window = PatternState()
            self._scorer.pre_kernel(layer, window, query)
            valid = layer.valid
            score = self._scorer.score(layer, window).float()
            if self.rule == "tova":  # TOVA's heads share one selection: so does the share, by their mean score
                score = score.mean(dim=1, keepdim=True).expand_as(score).contiguous()
            state.token["evidence"] = score.masked_fill(~valid, 0.0)
            state.token["prompt"] = valid.float()
        else:  # a later call: its tokens are not the prompt's
            for name in ("evidence", "prompt"):
                state.token[name] = fit_tokens(state.token[name], layer.length)

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        return self._inner.score(layer, state)

    def selection_key(
        self, layer: LayerView, state: PatternState, budgets: Sequence[int], rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        """``rule``'s key at each row's budget less its share, then the share's best prompt tokens at +inf."""
        inner = [b - int(self.share * b) for b in budgets]
        key = self._inner.selection_key(layer, state, inner, rows)
        if not self.share:
            return key
        score, prompt = (fit_tokens(state.token[k], layer.length) for k in ("evidence", "prompt"))
        if rows is not None:
            sel = torch.tensor(list(rows), device=key.device)
            score, prompt = score.index_select(0, sel), prompt.index_select(0, sel)
        return protect_top_share(key, score, prompt > 0, self.share, budgets)
