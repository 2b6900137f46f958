"""The previous ``expected_attention`` implementation (before its decoding fast path, issue 26), kept
verbatim but renamed as the reference that ``tests/test_expected_attention_fast.py`` holds the current
one to: float64 running sums of the un-rotated queries (``q_sum``, ``q_outer``, ``count``), keys
rotated back with ``rotate_half``, ``mu.k`` by einsum and ``k^T S k`` by one bmm and a sum, a softmax
over the masked cache, and the base class's selection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from polykv_search.patterns.base import LayerView, Pattern, protected_ends
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class PreviousExpectedAttention(Pattern):
    """The previous ``ExpectedAttention`` (its docstring describes both)."""

    name: ClassVar[str] = "expected_attention_previous"
    n_future_positions: int = 512
    n_sink: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.n_future_positions, int) or self.n_future_positions < 1:
            raise ValueError(f"n_future_positions must be a positive integer, got {self.n_future_positions!r}")
        if not isinstance(self.n_sink, int) or self.n_sink < 0:
            raise ValueError(f"n_sink must be a non-negative integer, got {self.n_sink!r}")
        for flag in ("use_covariance", "use_vnorm"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if not isinstance(self.epsilon, (int, float)) or not float(self.epsilon) >= 0.0:
            raise ValueError(f"epsilon must be a non-negative number, got {self.epsilon!r}")

    # ------------------------------------------------------------------ statistics
    def pre_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        b, hq, q, d = query.shape
        if "count" not in state.row:
            state.row["real_seen"] = torch.zeros(b, dtype=torch.float64, device=query.device)
            state.row["count"] = torch.zeros(b, dtype=torch.float64, device=query.device)
            state.row["q_sum"] = torch.zeros(b, hq, d, dtype=torch.float64, device=query.device)
            if self.use_covariance:
                state.row["q_outer"] = torch.zeros(b, hq, d, d, dtype=torch.float64, device=query.device)
        cos, sin = (t.to(query.device, torch.float64) for t in layer.rotary_cos_sin(layer.query_range))
        post = query.double()
        pre = (post * cos - _rotate_half(post) * sin) / (cos * cos + sin * sin)  # [B, Hq, q, D]
        real = layer.query_valid(q)
        real = torch.ones(b, q, dtype=torch.float64, device=query.device) if real is None else real.double()
        rank = state.row["real_seen"][:, None] + real.cumsum(-1) - 1  # among the row's real tokens
        weight = real * (rank >= self.n_sink)  # [B, q]
        state.row["real_seen"] = state.row["real_seen"] + real.sum(-1)
        state.row["count"] = state.row["count"] + weight.sum(-1)
        weighted = pre * weight[:, None, :, None]
        state.row["q_sum"] = state.row["q_sum"] + weighted.sum(-2)
        if self.use_covariance:
            state.row["q_outer"] = state.row["q_outer"] + weighted.transpose(-1, -2) @ pre

    def _statistics(self, state: PatternState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Mean ``[B, Hq, D]`` and covariance ``[B, Hq, D, D]`` (or None) of the pre-RoPE queries, fp32
        (the covariance's cancellation is done in float64)."""
        count = state.row["count"].clamp_min(1.0)[:, None, None]
        mean = state.row["q_sum"] / count
        if not self.use_covariance:
            return mean.float(), None
        cov = state.row["q_outer"] / count[..., None] - mean[..., :, None] * mean[..., None, :]
        return mean.float(), cov.float()

    # ---------------------------------------------------------------------- scores
    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        keys = layer.keys.float()
        b, h, n, d = keys.shape
        groups = state.row["q_sum"].shape[1] // h
        # The statistics rotated ahead, mu <- R mu and S <- R S R^T with R the mean rotation of the next
        # n_future_positions positions (R x = c * x + s * rotate_half(x)), enter the score only through
        # mu.k and k^T S k: rotate the keys back instead (R^T k = c * k - s * rotate_half(k)).
        start = layer.query_range.stop
        cos, sin = layer.rotary_cos_sin(range(start, start + self.n_future_positions))
        c, s = cos.mean(0).to(keys.device), sin.mean(0).to(keys.device)
        back = c * keys - s * _rotate_half(keys)  # [B, Hkv, n, D]
        mu, cov = self._statistics(state)
        logits = torch.einsum("bhnd,bhgd->bhgn", back, mu.view(b, h, groups, d)) * d**-0.5
        if cov is not None:  # k^T S k of every key and query head: one [n, D] x [D, g D] product per KV head
            per_head = cov.view(b * h, groups, d, d).transpose(1, 2).reshape(b * h, d, groups * d)
            kc = torch.bmm(back.reshape(b * h, n, d), per_head).view(b, h, n, groups, d)
            logits = logits + (kc * back[:, :, :, None]).sum(-1).transpose(-1, -2) / (2 * d)
        sinks = protected_ends(layer, n, self.n_sink, 0)  # the oldest n_sink real tokens
        scored = ~sinks if layer.all_valid else layer.valid & ~sinks  # [B, Hkv, n]
        logits = logits.masked_fill(~scored[:, :, None, :], float("-inf"))
        probs = logits.softmax(dim=-1).nan_to_num_(0.0).mean(dim=2)  # [B, Hkv, n]; no scored token: 0
        if self.use_vnorm:
            probs = (probs + float(self.epsilon)) * layer.values.float().norm(dim=-1)
        return probs.masked_fill(~scored, 0.0)

    def protected(self, layer: LayerView, budget: int) -> torch.Tensor | None:
        return protected_ends(layer, budget, self.n_sink, 0) if self.n_sink else None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
