"""Expected Attention: the attention future queries are expected to pay, from the queries seen.

Devoto et al., "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries
Distribution", 2025, https://arxiv.org/abs/2510.00636
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from polykv_search.patterns.base import POS_INF, LayerView, Pattern, protected_ends
from polykv_search.patterns.rope_frames import rotate_back, unrotate, unrotate_one
from polykv_search.patterns.state import PatternState


@dataclass(frozen=True)
class ExpectedAttention(Pattern):
    """Score each cached token by its expected attention under a Gaussian model of future queries.

    The queries seen so far (pre-RoPE, every real token but the first ``n_sink`` of each row) give a
    mean ``mu`` and covariance ``S`` per query head; both are rotated ahead by the average RoPE
    rotation ``R`` of the next ``n_future_positions`` positions (``mu <- R mu``, ``S <- R S R^T``).
    For a key ``k`` the expected ``exp(q.k / sqrt(D))`` of ``q ~ N(mu, S)`` has the log
    ``mu.k / sqrt(D) + k^T S k / (2 D)``; a softmax over the cached real tokens (sinks excluded)
    turns it into expected attention, averaged over each KV head's GQA group and multiplied by the
    token's value norm. The oldest ``n_sink`` real tokens are always kept (capped at the budget).

    Parameters
    ----------
    n_future_positions : int
        Future positions whose RoPE rotations are averaged (the next ones after the tokens seen).
    n_sink : int
        Attention sinks: the oldest real tokens, always kept and left out of the softmax; the queries
        of the first ``n_sink`` real tokens are left out of the statistics (outliers).
    use_covariance : bool
        Include the covariance term (False: the mean query alone).
    use_vnorm : bool
        Multiply by the value norm: ``(expected attention + epsilon) * ||v||``.
    epsilon : float
        Added to the expected attention before the value-norm rescaling.

    Defaults are kvpress's ``ExpectedAttentionPress`` (0.5.x).

    Notes
    -----
    * The pattern sees post-RoPE queries; it un-rotates them with the model's own rotary embedding
      (:meth:`~polykv_search.patterns.base.LayerView.rotary_cos_sin`). For Qwen3 the queries the
      attention function sees are after the q-norm, so the statistics are of ``q_norm(W_q h)``, as in
      kvpress's ``get_prerope_query_states``. Sequence indices stand for RoPE positions: a left-padded
      row's constant shift cancels between un-rotating and rotating ahead.
    * Statistics are running (``state.row``) over every query the layer has observed: the prompt and,
      in decoding, each generated token, so decoding evictions use all of them (kvpress's
      ``DecodingPress`` re-estimates from its buffer of recent hidden states instead). They are the
      row's real tokens seen (float64; the statistics' count follows from it), the mean and the centered
      sum of outer products (fp32, the latter laid out per KV head as the score reads it), merged per call
      (Welford's update, in place in fp32 for a decoding step; Chan et al.'s for a multi-token call,
      computed in float64), so that a score needs no cancellation of its own.
    * The score's scale is ``1/sqrt(D)`` as in the paper and kvpress (the model's own attention scale
      for every supported architecture). Until a row has a query past its sinks, its mean and
      covariance are zero (uniform expected attention).
    * kvpress protects the first ``n_sink`` prompt positions by giving them the maximum score; here
      they are protected tokens (the same kept set), and in decoding the oldest ``n_sink`` cached
      real tokens play that role.
    * Cost: ``O(n Hq D^2)`` per eviction for the covariance term (as kvpress's: one ``[n, D] x [D, g D]``
      product per KV head and a dot with the key), ``O(q Hq D^2)`` per call for the statistics; the
      scores rotate the keys back (``R^T k``) instead of rotating the statistics ahead, which is the same
      number. Decoding is the hot path (an eviction per step at the default interval), and on the CPU its
      cost is mostly the number of small ops: per step the statistics take one product (the un-rotated
      query less the mean), two in-place updates (the mean, and the rank-1 term written into the layout
      the product reads) and one counter; ``1 / (2 D count)`` and ``1 / sqrt(D)`` scale the two terms inside
      the ``baddbmm`` that adds them; every slot is scored (the sinks' few rows are cut from the logits,
      not from the keys, which would copy them); a one-token drop is chosen without the full selection key.
      ``tests/test_expected_attention_fast.py`` holds all of it to the previous, plainer implementation
      (``tests/expected_attention_reference.py``): the same kept sets.
    * Checked against kvpress 0.5.5's ``ExpectedAttentionPress`` on SmolLM2
      (``scripts/verify_kvpress_patterns.py``): after prefill, 1,619 of 1,620 (layer, KV head) kept sets
      are identical (3 prompts of 512 tokens, compression ratios 0.1 to 0.97); the other swaps one
      token whose kvpress score lies 7e-8 of the head's score range from kvpress's cut-off, a float
      rounding tie (the statistics here are running statistics of un-rotated queries, fp32 after a
      float64 merge, kvpress's are float32 from ``q_proj``; the same figure with the previous float64
      running sums, which ``tests/test_expected_attention_fast.py`` holds this implementation to).
      kvpress compresses the prompt only; the decoding phase here is this project's (see the statistics
      note above).
    """

    name: ClassVar[str] = "expected_attention"
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
        row = state.row
        if "mean" not in row:
            row["real_seen"] = torch.zeros(b, dtype=torch.float64, device=query.device)
            row["mean"] = torch.zeros(b, hq, d, device=query.device)
            if self.use_covariance:
                h = layer.num_kv_heads
                row["m2"] = torch.zeros(b, h, d, hq // h, d, device=query.device)  # see _covariance_layout
        cos, sin = layer.rotary_cos_sin(layer.query_range)
        real = layer.query_valid(q)
        if real is None and q == 1 and query.device.type == "cpu":
            self._add_step(row, query, cos, sin)
        else:
            self._add_queries(row, unrotate(query, cos, sin), real)

    def count(self, row: dict) -> torch.Tensor:
        """The queries in each row's statistics ``[B]`` (float64): its real tokens past the first ``n_sink``."""
        return (row["real_seen"] - self.n_sink).clamp_min(0.0)

    def _add_step(self, row: dict, query: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """A decoding step's query ``[B, Hq, 1, D]`` (rotated by ``cos``, ``sin``), its per-row counter read in
        Python (on the CPU that costs less than a tensor op per row quantity): the query counts once the row
        is past its sinks; Welford's update with delta the un-rotated query less the mean (one product),
        mean += delta / count, m2 += (1 - 1 / count) delta delta^T, both in place."""
        d = query.shape[-1]
        seen = row["real_seen"].tolist()
        shares, late = [], []
        for s in seen:
            c = s - self.n_sink  # queries counted before this one (negative: still among the sinks)
            share = 1.0 / (c + 1.0) if c >= 0 else 0.0
            shares.append(share)
            late.append(share * c if c >= 0 else 0.0)
        row["real_seen"].add_(1.0)
        mean = row["mean"]
        delta = unrotate_one(query, cos, sin, minus=mean)  # the un-rotated query less the mean
        if len(set(shares)) == 1:  # every row weighs its step alike (one row, or rows in step)
            mean.add_(delta, alpha=shares[0])
        else:
            mean.addcmul_(delta, torch.tensor(shares)[:, None, None])
        if self.use_covariance:
            m2 = row["m2"]
            a = delta.view(*m2.shape[:2], -1, d)  # [B, Hkv, g, D]
            if len(set(late)) == 1:  # likewise
                right, value = a, late[0]
            else:
                right, value = a * torch.tensor(late)[:, None, None, None], 1.0
            m2.addcmul_(a.transpose(2, 3)[..., None], right[:, :, None], value=value)

    def _add_queries(self, row: dict, pre: torch.Tensor, real: torch.Tensor | None) -> None:
        """Merge the statistics of this call's un-rotated queries ``pre`` ``[B, Hq, q, D]`` (float64; those of
        real tokens past the row's first ``n_sink``) into the running ones (Chan et al.'s pairwise update,
        in float64)."""
        b, hq, q, d = pre.shape
        seen, count = row["real_seen"], self.count(row)
        if real is None:  # every query is real: their ranks among the row's real tokens are seen + 0..q-1
            weight = (seen[:, None] + torch.arange(q, device=seen.device) >= self.n_sink).double()
            row["real_seen"] = seen + q
        else:
            real = real.double()
            weight = real * (seen[:, None] + real.cumsum(-1) - 1 >= self.n_sink)
            row["real_seen"] = seen + real.sum(-1)
        w = weight[:, None, :, None]  # [B, 1, q, 1]
        added = weight.sum(-1)
        chunk_mean = (pre * w).sum(-2) / added.clamp_min(1.0)[:, None, None]
        total = count + added
        mean = row["mean"].double()
        delta = chunk_mean - mean
        row["mean"] = torch.addcmul(mean, delta, (added / total.clamp_min(1.0))[:, None, None]).float()
        if self.use_covariance:
            centered = pre - chunk_mean[:, :, None]
            m2 = (centered * w).transpose(-1, -2) @ centered  # the chunk's own, about its mean
            between = (count * added / total.clamp_min(1.0))[:, None, None, None]
            m2 = m2 + delta[..., :, None] * delta[..., None, :] * between  # [B, Hq, D, D], float64
            h = row["m2"].shape[1]
            row["m2"] = (row["m2"].double() + _covariance_layout(m2, h)).float()

    # ---------------------------------------------------------------------- scores
    def _expected(self, layer: LayerView, state: PatternState, lo: int, ranking: bool = False) -> torch.Tensor:
        """The score of the slots from ``lo`` on ``[B, Hkv, n - lo]``; ``lo``: the sinks when the layer holds
        no padding (they are the first slots), else 0 (then sinks and padding score 0). ``ranking``: only the
        order matters (an eviction), so an unpadded layer's score may come ``g`` times larger (the group's
        sum, not its mean: one op fewer)."""
        keys = layer.keys
        b, h, n, d = keys.shape
        # The statistics rotated ahead, mu <- R mu and S <- R S R^T with R the mean rotation of the next
        # n_future_positions positions, enter the score only through mu.k and k^T S k: rotate the keys back.
        start = layer.query_range.stop
        ahead = layer.rotary_cos_sin(range(start, start + self.n_future_positions))
        # Every slot is scored and the first lo cut from the logits: rotating a slice of the cache would copy it.
        flat = rotate_back(keys.float(), *ahead).view(b * h, n, d)
        mean = state.row["mean"]  # [B, Hq, D]
        groups = mean.shape[1] // h
        mu = mean.view(b * h, groups, d)
        if not self.use_covariance:  # mu.k / sqrt(D)
            logits = torch.bmm(mu, flat.transpose(1, 2)).mul_(d**-0.5)  # [B Hkv, g, n]
        else:  # k^T m2 k: one [n, D] x [D, g D] product per KV head, then the dot with k; times 1 / (2 D count)
            per_head = state.row["m2"].view(b * h, d, groups * d)
            kc = torch.bmm(flat, per_head).view(b * h * n, groups, d)
            quad = torch.bmm(kc, flat.view(b * h * n, d, 1))
            scale = _covariance_scale(state.row["real_seen"], self.n_sink, d)
            if isinstance(scale, float):  # every row alike: baddbmm scales the quadratic form itself
                quad, beta = quad.view(b * h, n, groups), scale
            else:
                quad, beta = (quad.view(b, h * n * groups) * scale[:, None]).view(b * h, n, groups), 1.0
            logits = torch.baddbmm(quad.transpose(1, 2), mu, flat.transpose(1, 2), beta=beta, alpha=d**-0.5)
        logits = logits.view(b, h, groups, n)[..., lo:]
        if layer.all_valid:
            probs = logits.softmax(dim=-1)
            probs = probs.sum(dim=2) if ranking else probs.mean(dim=2)  # [B, Hkv, m]
            if self.use_vnorm:
                vnorm = torch.linalg.vector_norm(layer.values.float(), dim=-1)[..., lo:]
                eps = float(self.epsilon) * (groups if ranking else 1)
                probs = (probs + eps) * vnorm if eps else probs * vnorm
            return probs
        scored = layer.valid & ~protected_ends(layer, n, self.n_sink, 0)  # real tokens but the oldest n_sink
        logits = logits.masked_fill(~scored[:, :, None, :], float("-inf"))
        probs = logits.softmax(dim=-1).nan_to_num_(0.0).mean(dim=2)  # [B, Hkv, n]; no scored token: 0
        if self.use_vnorm:
            probs = (probs + float(self.epsilon)) * layer.values.float().norm(dim=-1)
        return probs.masked_fill(~scored, 0.0)

    def _sinks(self, layer: LayerView) -> int:
        """The sinks' slots (the first ones) when the layer holds no padding, else 0."""
        return min(self.n_sink, layer.length) if layer.all_valid else 0

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        lo = self._sinks(layer)
        return F.pad(self._expected(layer, state, lo), (lo, 0), value=0.0)

    def selection_key(
        self, layer: LayerView, state: PatternState, budgets: Sequence[int], rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        lo = self._sinks(layer)
        if not layer.all_valid or len(set(budgets)) > 1 or budgets[0] < lo:
            return super().selection_key(layer, state, budgets, rows)
        # the protected sinks (at this budget) are the slots the score leaves out, the first lo
        key = F.pad(self._expected(layer, state, lo, ranking=True), (lo, 0), value=POS_INF)
        return key if rows is None else key.index_select(0, torch.tensor(list(rows), device=key.device))

    def cache_update(self, layer: LayerView, state: PatternState, budget: int) -> torch.Tensor:
        n, lo = layer.length, self._sinks(layer)
        if not layer.all_valid or n != budget + 1 or budget < lo:
            return super().cache_update(layer, state, budget)
        # a decoding step drops one token: select_keep's choice (the newest of the lowest scores), past the sinks
        lowest = self._expected(layer, state, lo, ranking=True).flip(-1).argmin(dim=-1, keepdim=True)  # from the newest
        slot, from_newest = _slots(budget, layer.keys.device)
        return slot + (from_newest <= lowest)  # the slots at and past the dropped one move up by one

    #: the batched selection ranks by ``selection_key``, as ``cache_update`` does (not one call per budget)
    cache_update_rows = Pattern.cache_update_rows

    def protected(self, layer: LayerView, budget: int) -> torch.Tensor | None:
        return protected_ends(layer, budget, self.n_sink, 0) if self.n_sink else None


def _covariance_scale(real_seen: torch.Tensor, n_sink: int, d: int) -> torch.Tensor | float:
    """``1 / (2 D count)`` per row ``[B]`` fp32 (``count``: the real tokens seen past the ``n_sink`` first, at
    least 1), so that ``k^T m2 k`` times it is ``k^T S k / 2D``; on the CPU computed from the counters read as
    Python numbers, and one float when every row has the same count."""
    if real_seen.device.type == "cpu":
        scales = [(0.5 / d) / max(s - n_sink, 1.0) for s in real_seen.tolist()]
        if len(set(scales)) == 1:
            return scales[0]  # baddbmm rounds it to fp32, as the per-row tensor is
        return torch.tensor(scales)
    return ((0.5 / d) / (real_seen - n_sink).clamp_min(1.0)).float()


def _covariance_layout(m2: torch.Tensor, h: int) -> torch.Tensor:
    """Per-query-head matrices ``[B, Hq, D, D]`` in the layout the scores read, ``[B, Hkv, D, g, D]``: row
    ``d`` of each KV head's group side by side, so that one ``[m, D] x [D, g D]`` product applies the group
    (the matrices are symmetric, so rows and columns are interchangeable)."""
    b, hq, d, _ = m2.shape
    return m2.view(b, h, hq // h, d, d).transpose(2, 3)


_SLOTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _slots(budget: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``arange(budget)`` and each slot's distance from slot ``budget`` (the newest of ``budget + 1``),
    remembered per budget and device (read-only)."""
    key = (budget, str(device))
    hit = _SLOTS.get(key)
    if hit is None:
        slot = torch.arange(budget, device=device)
        hit = _SLOTS[key] = (slot, budget - slot)
        if len(_SLOTS) > 16:
            _SLOTS.pop(next(iter(_SLOTS)))
    return hit
