"""KVzip: query-agnostic KV-cache eviction scored by context reconstruction.

Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction", 2025,
https://arxiv.org/abs/2505.23416
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from polykv_search.patterns.base import (
    POS_INF,
    LayerView,
    PassInputs,
    Pattern,
    PoolPrior,
    protected_ends,
    valid_rank,
)
from polykv_search.patterns.selection import protect_top_share
from polykv_search.patterns.state import PatternState, fit_tokens


@dataclass(frozen=True)
class KVzip(Pattern):
    """Keep the prompt tokens that a "repeat the context" pass attends to most.

    A *model-level* pattern: after the prompt is prefilled, the runtime runs a reconstruction pass
    (:mod:`polykv_search.runtime.reconstruction`: a repeat prompt, then the prompt's own tokens,
    teacher-forced over the full cache) and calls :meth:`reconstruct` for every attention call of
    it. A prompt token's score, per KV head, is the largest attention any reconstruction query of
    that KV head's GQA group gives it (softmax over the whole cache: the prompt and the pass's own
    tokens so far). Every layer then keeps its top-``budget`` tokens, the first ``n_sink`` always.

    Parameters
    ----------
    n_sink : int
        Oldest tokens always kept (kvpress raises its first 4 tokens' scores above all others, i.e. kept).
    chunk_size : int
        Prompt tokens reconstructed per pass call (kvpress: 2,048). Each chunk repeats its slice of the
        prompt; its queries score *every* prompt token, with the softmax over the whole cache (the prompt
        and the pass's own tokens so far). kvpress scores a chunk's tokens by that chunk's queries only,
        with the softmax over the 4 sinks, the chunk and its repeat tokens. The two agree for prompts of
        at most one chunk (measured below).
    query_chunk : int
        Reconstruction queries scored at once, at most (memory and speed, not results).
    boundary : int
        The prompt's last tokens always kept, as the sinks are (0: none, the default). They end the context
        where the question or the chat template's turn change follows, the tokens eviction at tight budgets
        must not lose (arXiv 2605.18053). At a budget ``b`` the sinks come first: the last
        ``min(boundary, b - n_sink)`` prompt tokens are protected, in prefill and in decoding, and in a pool
        they count among its protected tokens. kvpress's ``KVzipPress`` has no counterpart (its ``n_sink`` only).
    plus : bool
        KVzip+'s normalization (kvpress's ``KVzipPress(kvzip_plus_normalization=True)``; off by default): a
        pass query ``t``'s attention to prompt token ``i`` through query head ``j`` is weighed by what it
        writes into the residual stream relative to what the layer read, ``a[j, t, i] * ||v_i W_o[j]|| /
        ||x_t||`` (``x_t``: the attention module's input hidden state, ``W_o[j]``: head ``j``'s block of the
        output projection), before the maximum over the group's heads and the queries. The scores are then
        no longer probabilities; they compare across layers as a pool ranks them. Needs
        :class:`~polykv_search.patterns.base.PassInputs` in :meth:`reconstruct` (``needs_pass_inputs``), which the
        runtime's reconstruction pass hands over (``runtime.reconstruction.handing_pass_inputs``). Checked
        against the oracle, a hand computation and kvpress 0.5.5 (``kvzip-plus`` and ``kvzip-plus-model`` in
        ``scripts/kvpress_checks.py``; SmolLM2, 3 prompts of 512 tokens; ``studies/kvzip/kvpress_verify_plus.json``):
        kvpress's KVzip+ scores ranked per head keep the sets kept here in 810 of 810 cells (ratios 0.5, 0.75,
        0.9); with ``allocation="model"`` against its own pooled masks 540 of 540 at 0.5 and 0.75 (at 0.9 its
        pool is 18 tokens larger than 90 heads of 51: a superset, nothing swapped).
    allocation : {"head", "layer", "model"}
        Which tokens share one ranking. ``"head"`` (default): every KV head keeps its own top ``budget``.
        ``"layer"`` (kvpress's ``layerwise=True``): the layer's ``Hkv * budget`` best over all its KV heads.
        ``"model"`` (kvpress's default): the ``sum(Hkv * budget_l)`` best over every layer using this same
        pattern in this phase. With ``"layer"`` and ``"model"`` the heads hold different numbers of tokens
        (:mod:`polykv_search.runtime.pooled`: the pool's total holds through the question and decoding).
    weight : float or tuple of float
        A static prior on this layer's place in a ``"model"`` pool (> 0; 1.0, the default, changes nothing): its
        tokens enter the pool's ranking with ``score * weight``. A product, not ``score + log(weight)``: the
        scores are probabilities (or, with ``plus``, positive and unitless), so a product is the same comparison
        as ``log(score) + log(weight)``, scale-free, and never reorders a KV head's own tokens (only how many
        each head keeps changes). Layers whose patterns differ only in ``weight``, ``floor`` and ``cap`` share one
        pool (:meth:`pool_identity`), so a solver can steer each layer while the pool still adapts per prompt.
        With ``"layer"`` one weight scales every cell of the pool alike, so it is refused there, unless given per KV
        head.
    floor : int or tuple of int
        Each KV head of this layer keeps at least its top ``min(floor, budget)`` tokens in the pool (0: none): they
        rank above every unprotected token of the pool, so they always fit after prefill; once the appended tokens
        outgrow the pool they go before them, like the pool's other prompt tokens (the sinks and the boundary stay).
    cap : int or tuple of int
        Each KV head of this layer keeps at most its top ``cap`` prompt tokens in the pool (0: no cap; its protected
        tokens are kept whatever the cap). The pool may then hold fewer than its total. ``floor <= cap`` when both
        are set. kvpress's ``KVzipPress`` has no counterpart of ``weight``, ``floor`` or ``cap``.

        *Per KV head*: each of the three may be a tuple with one value per KV head of the layer (spec text
        ``weight=2/0.5/1``, JSON a list), the ``h``-th for KV head ``h``; the runtime refuses one of another length
        (:meth:`~polykv_search.patterns.base.PoolPrior.per_head`). A tuple repeating one value is that value.
    evidence : float
        Share of the budget, in [0, 1), that stays with the prompt's best-reconstructed tokens for good (0: none,
        the default, today's rule). At budget ``b`` a KV head protects, beside its sinks and boundary, its
        ``min(floor(evidence * b), b - protected)`` highest-scored prompt tokens; the rest of the budget follows
        the rule below (appended tokens first, newest first), so a long generation no longer pushes every prompt
        token out. Per head the prefill keeps the same tokens as without it (those tokens are its top ones
        anyway); in a pool (``allocation`` "layer" / "model") every cell keeps its share ahead of the pool's
        ranking, in prefill too: a per-head floor. kvpress has no counterpart (its decoding keeps every token).

    Notes
    -----
    * Prefill: the deferred eviction after the pass. With ``allocation="head"`` every KV head of every
      layer keeps its own top ``budget`` (the cross-head and cross-layer allocation is then the solvers'
      job). kvpress's ``KVzipPress`` drops its lowest scores over several heads at once: with
      ``layerwise=True`` over the heads of each layer (``int(Hkv * n * ratio)`` per layer), with its
      default ``layerwise=False`` over all layers and heads (``allocation="layer"`` and ``"model"`` here).
      Without them, uniform kvzip loses ruler's needles (``studies/kvzip/study_kvzip.md``, exploratory section).
    * Decoding, which has no reconstruction pass: prompt tokens keep their pass scores and every
      token appended after the pass ranks above them, newest first. So kvzip in decoding evicts the
      least-reconstructed prompt tokens first and appended tokens (question, answer) only when the
      budget cannot hold them all (kvpress never evicts appended tokens at all). The pass runs for
      a strategy that uses kvzip in either phase.
    * The chat template: here the prompt is repeated and scored whole. kvpress 0.5.5 counts the
      template's prefix (``prefix_length``, 24 tokens on SmolLM2) out of the pass: it is not repeated,
      its tokens past the 4 sinks keep score 0, so they are evicted first, and they are left out of the
      score's softmax.
    * A query's attention to a key is ``exp(logit - lse)``: where the pass's kernel hands over its
      log-sum-exp (SDPA on CPU: the ``lse`` argument of :meth:`reconstruct`), only the prompt's logits are
      computed and the maximum is taken before the exponential; elsewhere the probabilities are recomputed. The
      two agree to float rounding, with the same kept sets (``tests/test_kvzip_fast.py``).
    * Checked against kvpress 0.5.5's ``KVzipPress`` on SmolLM2 (``scripts/verify_kvpress_patterns.py
      --patterns kvzip``; 3 prompts of 512 tokens, compression ratios 0.5, 0.75 and 0.9, i.e. budgets
      256, 128 and 51; 270 (prompt, layer, KV head) sets per ratio; ``studies/kvzip/study_kvzip.md``):

      - *The scores are the same.* kvpress fed the raw prompt (its ``prefix_length`` set to 0), one
        chunk; its ``score_val`` ranked by the rule here (per head top-``b``, first 4 kept): 809 of 810
        kept sets identical; the other swaps one token for another of the very same float32 kvpress
        score (a tie that float rounding here orders the other way).
      - *kvpress's own selection differs by its allocation.* ``layerwise=True`` (the closest setting):
        its heads keep 4 to 512 tokens; identical sets 0, 0 and 4 of 270; Jaccard index of each layer's
        kept (head, token) pairs 0.71, 0.59, 0.53; share of the tokens kept here that kvpress keeps too
        82 %, 71 %, 67 % (ratios 0.5, 0.75, 0.9). ``layerwise=False`` (its default; layers keep 4 to 451
        tokens per head on average): Jaccard 0.64, 0.39, 0.21; tokens in common 78 %, 56 %, 34 %.
      - *Chunking differs* (see ``chunk_size``; both sides ``chunk_size=128``, 4 chunks, kvpress's
        scores ranked by the rule here): no identical set; Jaccard 0.79, 0.71, 0.65; tokens in common
        88.0 %, 82.5 %, 78.8 %.
      - *The chat template's prefix differs* (24 prefix tokens + 512, kvpress's own
        ``prefix_length``): prefix tokens 4..23 kept 48.3 %, 26.5 %, 12.1 % here, never by kvpress; from
        kvpress's scores, Jaccard 0.72, 0.63, 0.58 (its pass repeats the 512 tokens after the prefix,
        the one here all 536, so the two passes' queries differ too).
    """

    name: ClassVar[str] = "kvzip"
    model_level: ClassVar[bool] = True
    n_sink: int = 4
    chunk_size: int = 2048
    query_chunk: int = 256
    allocation: str = "head"
    boundary: int = 0
    plus: bool = False
    weight: float | tuple[float, ...] = 1.0
    floor: int | tuple[int, ...] = 0
    cap: int | tuple[int, ...] = 0
    evidence: float = 0.0

    ALLOCATIONS: ClassVar[tuple[str, ...]] = ("head", "layer", "model")

    def __post_init__(self) -> None:
        for field_name in ("n_sink", "chunk_size", "query_chunk", "boundary"):
            value = getattr(self, field_name)
            low = 0 if field_name in ("n_sink", "boundary") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{field_name} must be an integer >= {low}, got {value!r}")
        if self.allocation not in self.ALLOCATIONS:
            raise ValueError(f"allocation must be one of {', '.join(self.ALLOCATIONS)}, got {self.allocation!r}")
        if not isinstance(self.plus, bool):
            raise ValueError(f"plus must be true or false, got {self.plus!r}")
        if isinstance(self.evidence, bool) or not isinstance(self.evidence, (int, float)) or not 0 <= self.evidence < 1:
            raise ValueError(f"evidence must be a number in [0, 1), got {self.evidence!r}")
        self._check_prior()

    def _check_prior(self) -> None:
        for name in ("weight", "floor", "cap"):  # a per-head list as a tuple; one that repeats one value as it
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                value = tuple(value)
                if not value:
                    raise ValueError(f"{name} must be one value or one per KV head, got an empty list")
                object.__setattr__(self, name, value[0] if len(set(value)) == 1 else value)
        for w in _each(self.weight):
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w) or w <= 0:
                raise ValueError(f"weight must be a finite number > 0, got {w!r}")
        for name in ("floor", "cap"):
            for v in _each(getattr(self, name)):
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        floors, caps = _each(self.floor), _each(self.cap)
        if len(floors) > 1 and len(caps) > 1 and len(floors) != len(caps):
            raise ValueError(f"floor and cap give {len(floors)} and {len(caps)} per-head values; give as many of each")
        n = max(len(floors), len(caps))
        for f, c in zip(floors * n if len(floors) == 1 else floors, caps * n if len(caps) == 1 else caps):
            if c and f > c:
                raise ValueError(f"floor must be at most cap, got floor={f} and cap={c}")
        w = self.weight
        if self.allocation == "head" and not self.prior.plain:
            raise ValueError(
                f"weight, floor and cap steer a pool's ranking; they need allocation='layer' or 'model', got "
                f"weight={_text(w)}, floor={_text(self.floor)}, cap={_text(self.cap)} with allocation='head'"
            )
        if self.allocation == "layer" and not isinstance(w, tuple) and w != 1.0:
            raise ValueError(
                f"weight needs allocation='model' or one value per KV head (one layer's pool ranks all its heads "
                f"alike), got {w!r}"
            )

    @property
    def needs_pass_inputs(self) -> bool:
        return self.plus

    @property
    def pooled(self) -> str | None:
        """The pool its tokens are ranked over beyond one KV head (``"layer"`` or ``"model"``), or None."""
        return None if self.allocation == "head" else self.allocation

    @property
    def prior(self) -> PoolPrior:
        w = self.weight
        return PoolPrior(tuple(map(float, w)) if isinstance(w, tuple) else float(w), self.floor, self.cap)

    def pool_identity(self) -> KVzip:
        return self if self.prior.plain else replace(self, weight=1.0, floor=0, cap=0)

    def alone(self) -> KVzip:
        return self if self.allocation == "head" else replace(self.pool_identity(), allocation="head")

    def reconstruct(
        self,
        layer: LayerView,
        state: PatternState,
        query: torch.Tensor,
        prompt_len: int,
        lse: torch.Tensor | None,
        inputs: PassInputs | None = None,
    ) -> None:
        """One attention call of the reconstruction pass: fold its queries' attention to the first
        ``prompt_len`` slots (the prompt) into the running per-KV-head maximum (from the kernel's
        log-sum-exp ``lse`` when it handed one over; weighed by ``inputs`` with ``plus``)."""
        best = state.token.get("kvzip")
        if best is None:
            best = torch.zeros(layer.valid.shape[:2] + (prompt_len,), dtype=torch.float32, device=layer.keys.device)
        weights = None
        if self.plus:
            if inputs is None:
                raise RuntimeError(
                    f"kvzip[plus=true] (layer {layer.layer_idx}) needs the pass's hidden-state norms and output "
                    "projection (PassInputs), which this runtime did not hand to reconstruct"
                )
            weights = plus_weights(layer, inputs, prompt_len)
        if lse is None:
            best = self._from_probs(layer, query, prompt_len, best, weights)
        else:
            best = self._from_lse(layer, query, prompt_len, best, lse, weights)
        state.token["kvzip"] = best
        state.token["scored"] = layer.valid[..., :prompt_len].float()
        if self.boundary:
            rank, count = valid_rank(layer.valid[..., :prompt_len])
            to_end = (count - rank).masked_fill(~layer.valid[..., :prompt_len], 0)
            state.token["to_end"] = to_end.masked_fill(to_end > self.boundary, 0).float()

    def _from_lse(self, layer, query: torch.Tensor, prompt_len: int, best: torch.Tensor, lse: torch.Tensor, weights):
        """The maximum from the kernel's log-sum-exp ``lse`` ``[B, Hq, q]``: a query's attention to a key is
        ``exp(logit - lse)``, so only the prompt's logits are needed, and the maximum is taken before the
        exponential (one ``[B, Hkv, prompt_len]`` exp per call instead of a softmax over the whole cache)."""
        b, hq, q, d = query.shape
        h = layer.num_kv_heads
        g = hq // h
        keys_t = layer.keys[..., :prompt_len, :].float().transpose(-1, -2)
        scaled = query.float() * layer.scaling  # as attention_probs: the scale goes on the queries
        lse = lse.float().view(b, h, g, q)
        # every pass query comes after the whole prompt: a mask only for padding or a sliding window
        plain = layer.all_valid and layer.sliding_window is None
        mask = None if plain else layer.allowed(layer.query_range)[..., :prompt_len]
        qvalid = layer.query_valid(q)
        top = torch.full_like(best, float("-inf"))
        # about 2**20 logits per KV head at a time (a few MiB, which stay in the CPU caches): the
        # maximum, unlike a softmax, can be taken in any number of pieces
        chunk = max(1, min(self.query_chunk, (1 << 20) // (g * prompt_len)))
        for start in range(0, q, chunk):
            stop = min(start + chunk, q)
            c = stop - start
            logits = torch.matmul(scaled[..., start:stop, :].reshape(b, h, g * c, d), keys_t).view(b, h, g, c, -1)
            logits.sub_(lse[..., start:stop, None])
            if weights is not None:  # KVzip+: log(a * ||v W_o|| / ||x||), still maximised before the exp
                logits.add_(weights.log_out.view(b, h, g, 1, -1)).sub_(weights.log_in[:, None, None, start:stop, None])
            if mask is not None:
                logits.masked_fill_(~mask[..., start:stop, :][:, :, None], float("-inf"))
            if qvalid is not None:
                logits.masked_fill_(~qvalid[:, None, None, start:stop, None], float("-inf"))
            top = torch.maximum(top, logits.amax(dim=(2, 3)))
        return torch.maximum(best, top.exp_())

    def _from_probs(self, layer, query: torch.Tensor, prompt_len: int, best: torch.Tensor, weights) -> torch.Tensor:
        """The maximum from the probabilities themselves (a call whose kernel gave no log-sum-exp)."""
        qpos = layer.query_range
        qvalid = layer.query_valid(query.shape[-2])
        b, hq, q, _ = query.shape
        for start in range(0, q, self.query_chunk):
            stop = min(start + self.query_chunk, q)
            probs = layer.attention_probs(query[..., start:stop, :], qpos[start:stop])[..., :prompt_len]
            if qvalid is not None:
                probs = probs * qvalid[:, None, start:stop, None]
            if weights is not None:  # KVzip+
                probs = probs * weights.log_out.exp()[:, :, None] * (-weights.log_in[:, None, start:stop, None]).exp()
            per_kv = probs.amax(dim=-2).view(b, layer.num_kv_heads, hq // layer.num_kv_heads, prompt_len)
            best = torch.maximum(best, per_kv.amax(dim=2))
        return best

    def post_kernel(self, layer: LayerView, state: PatternState, query: torch.Tensor) -> None:
        if "kvzip" in state.token:  # a decoding call: the appended tokens have no pass score
            state.fit(layer.length)

    def score(self, layer: LayerView, state: PatternState) -> torch.Tensor:
        if "kvzip" not in state.token:
            raise RuntimeError(
                f"kvzip (layer {layer.layer_idx}) needs the reconstruction pass before it can evict; "
                "apply it through polykv_search.runtime.apply_strategy(..., reconstruction=...)"
            )
        n = layer.length
        scored = fit_tokens(state.token["scored"], n) > 0
        zipped = fit_tokens(state.token["kvzip"], n)
        appended = 2.0 + layer.positions.float() / (layer.seen + 1)  # above any probability, newest first
        if self.plus:  # KVzip+ scores are not probabilities: above the largest of them instead
            appended = appended * zipped.max().clamp(min=1.0)
        return torch.where(scored, zipped, appended)

    def protected(self, layer: LayerView, budget: int) -> torch.Tensor:
        return protected_ends(layer, budget, self.n_sink, 0)

    def selection_key(
        self, layer: LayerView, state: PatternState, budgets: Sequence[int], rows: Sequence[int] | None = None
    ) -> torch.Tensor:
        """The base key with the prompt's last ``min(boundary, b - n_sink)`` tokens (``b``: each row's budget)
        protected too, then the ``evidence`` share of the best prompt tokens; ``state.token["to_end"]`` holds each
        of the last ``boundary`` prompt tokens' place from the prompt's end (1: the last), gathered with the cache."""
        key = super().selection_key(layer, state, budgets, rows)
        sel = None if rows is None else torch.tensor(list(rows), device=key.device)

        def take(name: str) -> torch.Tensor:
            t = fit_tokens(state.token[name], layer.length)
            return t if sel is None else t.index_select(0, sel)

        if self.boundary and "to_end" in state.token:
            to_end = take("to_end")
            limits = [min(self.boundary, max(0, b - self.n_sink)) for b in budgets]
            limit = torch.tensor(limits, dtype=to_end.dtype, device=to_end.device)
            limit = limit.view(-1, 1, 1) if len(limits) > 1 else limit
            key = key.masked_fill((to_end > 0) & (to_end <= limit), POS_INF)
        if self.evidence and "kvzip" in state.token:
            key = protect_top_share(key, take("kvzip"), take("scored") > 0, self.evidence, budgets)
        return key


def _each(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _text(value) -> str:
    """A prior as a spec writes it: ``1.5`` or, per KV head, ``1.5/0.5``."""
    return "/".join(f"{v!r}" for v in value) if isinstance(value, tuple) else repr(value)


@dataclass(frozen=True)
class PlusWeights:
    """KVzip+'s factors of one pass call, as logarithms: ``log_out`` ``[B, Hq, prompt_len]`` is
    ``log ||v_i W_o[j]||`` per query head ``j`` and prompt token ``i``, ``log_in`` ``[B, q]`` is ``log ||x_t||``."""

    log_out: torch.Tensor
    log_in: torch.Tensor


def plus_weights(layer: LayerView, inputs: PassInputs, prompt_len: int) -> PlusWeights:
    """KVzip+'s factors (see ``KVzip.plus``). ``||v W||^2 = v (W W^T) v``: one ``[Dv, Dv]`` Gram matrix per
    query head instead of projecting every value to the hidden size."""
    values = layer.repeat_heads(layer.values[..., :prompt_len, :].float())  # [B, Hq, n, Dv]
    w = inputs.out_proj.float()
    gram = torch.matmul(w, w.transpose(-1, -2))  # [Hq, Dv, Dv]
    squared = (torch.matmul(values, gram) * values).sum(-1).clamp_(min=0.0)
    return PlusWeights(0.5 * squared.log(), inputs.hidden_norm.float().log())
