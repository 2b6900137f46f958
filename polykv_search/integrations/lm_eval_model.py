"""The ``polykv`` model type of lm-evaluation-harness: lm-eval's HF model, every request under a strategy.

Importing this module registers ``polykv`` in lm-eval's model registry (lm-eval 0.4.x has no plugin
entry points, so ``lm_eval`` itself cannot find it: use ``polykv-lm-eval``, the same CLI with this
module imported, or import it before ``lm_eval.simple_evaluate(model="polykv", ...)``).

Model arguments (``--model_args``), besides every argument of lm-eval's ``hf`` model:

``pretrained``
    ``smollm2-135m`` (the default; resolved offline from polykv-search's cache), a ``.gguf`` file,
    a local checkpoint directory, a hub id, or a loaded ``PreTrainedModel``.
``strategy``
    A strategy JSON file, ``full`` (the default: FullKV, still through the runtime) or
    ``uniform:PATTERN`` with ``budget=B``.
``decode_interval``, ``interval_mode``
    Decoding evicts every k steps, ``within`` the budget (default) or ``over`` it (as
    ``polykv-search score --decode-interval/--interval-mode``).

The protocol is the one ``polykv-search score`` uses (:mod:`polykv_search.evaluation.runner`), one
request at a time with a fresh cache, because eviction happens after a prefill call and a request
scored in one forward would see no eviction at all:

- **loglikelihood**: the context is prefilled in one call and compressed; the continuation (all
  but its last token) is fed in a second call on that cache; the first continuation token is
  predicted by the context call. Left truncation to ``max_length`` is lm-eval's.
- **loglikelihood_rolling**: each of lm-eval's windows is one such request.
- **generate_until**: ``model.generate`` on the prompt: the prompt's prefill is compressed, then
  decoding evicts with each layer's decoding plan. ``batch_size`` is not used (no padding enters
  a compressed cache).

The KV bytes each request holds at its end (and what FullKV would hold) are recorded;
``get_model_info`` puts their means per request, overall and per task, into the ``config`` block of
lm-eval's results under ``polykv`` (see :meth:`PolyKVLM.kv_summary`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

from polykv_search.evaluation.runner import _Caller, teacher_forced_logits
from polykv_search.integrations.lm_eval_support import MODEL_NAME, check_model_args
from polykv_search.models import DEFAULT_MODEL, model_path, resolve_model
from polykv_search.runtime import apply_strategy, model_spec
from polykv_search.runtime.reconstruction import ReconstructionInputs
from strategies import Strategy, StrategyError

PROTOCOL = (
    "one request at a time, fresh cache: loglikelihood = compressed context call, then the continuation "
    "(all but its last token) on that cache; generate_until = compressed prompt prefill, then decoding "
    "with the decoding plan (as polykv-search score)"
)
#: under lm-eval's logger, so its ``--verbosity`` applies
log = logging.getLogger("lm_eval.polykv")


@dataclass(frozen=True)
class KVRecord:
    """KV bytes one request held at its end, and what FullKV would have held."""

    task: str | None
    doc_id: int | None
    request_type: str
    kv_bytes: int
    full_kv_bytes: int


def resolve_strategy(spec: Any, num_layers: int, budget: Any = None) -> tuple[Strategy, str]:
    """The strategy of a ``strategy=`` model argument and its display name.

    Parameters
    ----------
    spec
        A :class:`~strategies.Strategy`, ``None``/``"full"``, ``"uniform:PATTERN"`` (needs
        ``budget``) or the path of a strategy JSON file.
    num_layers
        Layers of the model; the strategy must have as many.
    """
    if isinstance(spec, Strategy):
        strategy, name = spec, str(spec.provenance.get("name") or spec.provenance.get("solver") or "strategy")
    elif spec is None or spec == "full":
        strategy, name = Strategy.full(num_layers), "full"
    elif not isinstance(spec, str) or not spec.strip():
        raise StrategyError(f"polykv: strategy must be a strategy JSON path, 'full' or 'uniform:PATTERN', got {spec!r}")
    elif spec.startswith("uniform:"):
        pattern = spec.partition(":")[2]
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 1 or int(budget) != budget:
            raise StrategyError(f"polykv: strategy={spec} needs budget=B (a positive integer), got {budget!r}")
        try:
            strategy = Strategy.uniform(num_layers, pattern, int(budget))
        except StrategyError as err:
            raise StrategyError(f"polykv: strategy={spec}: {err}") from None
        name = f"uniform-{pattern}"
    else:
        strategy, name = Strategy.load(spec), spec
    strategy.check_model(num_layers)
    return strategy, name


def resolve_pretrained(pretrained: Any) -> Any:
    """What lm-eval's HF loader should load: polykv-search's cached checkpoint for a built-in name or a
    ``.gguf`` file (built offline on first use), anything else unchanged."""
    if not isinstance(pretrained, str):
        return pretrained
    source = resolve_model(pretrained)
    return model_path(source) if source.kind in ("builtin", "gguf") else pretrained


def _tag(request, request_type: str) -> tuple[str | None, int | None, str]:
    return getattr(request, "task_name", None), getattr(request, "doc_id", None), request_type


@register_model(MODEL_NAME)
class PolyKVLM(HFLM):
    """lm-eval's ``hf`` model whose every request runs under :func:`~polykv_search.runtime.apply_strategy`.

    Parameters
    ----------
    pretrained
        Model name, path or loaded model (see the module docstring); default ``smollm2-135m``.
    strategy, budget
        What to apply (see :func:`resolve_strategy`); default FullKV.
    decode_interval, interval_mode
        Decoding evicts every k steps (default 1: every step), holding at most the budget
        (``within``, default) or up to ``budget + k - 1`` tokens (``over``).
    device
        Default: ``cuda`` when available, else ``cpu`` (also when a CUDA device is asked for and there is
        none: lm-eval's CLI asks for ``cuda:0`` by default).
    **kwargs
        Everything lm-eval's ``hf`` model takes (``dtype``, ``max_length``, ``tokenizer``, ...).
    """

    def __init__(
        self,
        pretrained: Any = DEFAULT_MODEL,
        strategy: Any = "full",
        budget: Any = None,
        decode_interval: int = 1,
        interval_mode: str = "within",
        device: str | None = None,
        **kwargs: Any,
    ) -> None:
        given = {"pretrained": pretrained, "strategy": strategy, "budget": budget}
        check_model_args({**given, "decode_interval": decode_interval, "interval_mode": interval_mode})
        if isinstance(pretrained, str) and (
            device is None or (str(device).startswith("cuda") and not torch.cuda.is_available())
        ):
            if device is not None:  # lm-eval's CLI defaults to cuda:0 even where there is none
                log.warning("polykv: device %s is not available; using cpu", device)
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if kwargs.get("batch_size") not in (None, 1, "1"):
            log.info("polykv: requests run one at a time (batch_size=%s is not used)", kwargs["batch_size"])
        kwargs["batch_size"] = 1
        name = None
        if isinstance(strategy, str) and strategy != "full" and not strategy.startswith("uniform:"):
            strategy, name = Strategy.load(strategy), strategy  # checked above: before the model loads
        super().__init__(pretrained=resolve_pretrained(pretrained), device=device, **kwargs)
        if self.backend != "causal":
            raise StrategyError("polykv: only decoder-only (causal) models can run a KV-cache strategy")
        self.spec = model_spec(self.model)  # an unsupported architecture fails here, in one line
        self.strategy, self.strategy_name = resolve_strategy(strategy, self.spec.num_layers, budget)
        self.strategy_name = name or self.strategy_name
        self.decode_interval = decode_interval
        self.interval_mode = interval_mode
        self.kv_log: list[KVRecord] = []
        #: called after every request (``polykv-search score`` drives its progress bar with it)
        self.on_request: Callable[[], None] | None = None
        #: lm-eval's own tqdm bars
        self.show_progress = True
        self._caller = _Caller(self.model)
        self._reconstruction = ReconstructionInputs.from_tokenizer(self.tokenizer)
        self._tags: list[tuple] | None = None
        self._window_tag: tuple | None = None
        self._gen_tag: tuple | None = None

    # ------------------------------------------------------------------ helpers
    def _runtime(self):
        # kvzip's repeat prompts from lm-eval's tokenizer (the model was loaded by lm-eval, not load_model)
        return apply_strategy(
            self.model,
            self.strategy,
            decode_interval=self.decode_interval,
            interval_mode=self.interval_mode,
            reconstruction=self._reconstruction,
        )

    def _autocast(self) -> AbstractContextManager:
        if self.mixed_precision_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype)

    def _record(self, tag: tuple | None, report) -> None:
        task, doc_id, kind = tag or (None, None, "unknown")
        self.kv_log.append(KVRecord(task, doc_id, kind, int(report.kv_bytes), int(report.full_kv_bytes)))
        if self.on_request is not None:
            self.on_request()

    def _bar(self, total: int, desc: str, disable: bool):
        return tqdm(total=total, desc=desc, disable=disable or not self.show_progress or self.rank != 0)

    # ---------------------------------------------------------- loglikelihood
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self._tags = [_tag(r, "loglikelihood") for r in requests]
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.show_progress)
        finally:
            self._tags = None

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out: list[float] = []
        with self._bar(len(requests), "polykv: rolling loglikelihood requests", disable_tqdm) as bar:
            for request in requests:
                self._window_tag = _tag(request, "loglikelihood_rolling")
                try:
                    out.extend(super().loglikelihood_rolling([request], disable_tqdm=True))
                finally:
                    self._window_tag = None
                bar.update(1)
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """(log-prob, is-greedy) of each continuation: context call (compressed), then continuation call."""
        tags = self._tags if self._tags is not None and len(self._tags) == len(requests) else None
        out: list[tuple[float, bool]] = []
        with self._bar(len(requests), "polykv: loglikelihood requests", disable_tqdm) as bar:
            for i, (key, context, continuation) in enumerate(requests):
                answer, report = self._score_one(list(context), list(continuation))
                out.append(answer)
                self._record(tags[i] if tags else self._window_tag, report)
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, out[-1])
                bar.update(1)
        return out

    def _score_one(self, context: list[int], continuation: list[int]):
        """``((log-prob, is-greedy), cache report)`` of one request."""
        if not context or not continuation:
            raise ValueError("polykv: a loglikelihood request needs a non-empty context and continuation")
        if len(continuation) > self.max_length:
            raise ValueError(f"polykv: continuation of {len(continuation)} tokens exceeds max_length {self.max_length}")
        keep = self.max_length + 1 - len(continuation)  # lm-eval's left truncation of context + continuation
        if len(context) > keep:
            log.warning("polykv: context of %d tokens truncated from the left to %d", len(context), keep)
            context = context[-keep:]
        with self._runtime() as runtime, self._autocast():
            logits, _ = teacher_forced_logits(self.model, context, continuation, self._caller)
            report = runtime.report()
        logp = F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)
        target = torch.tensor(continuation, dtype=torch.long, device=logp.device)
        total = float(logp.gather(1, target[:, None]).sum())
        greedy = bool((logp.argmax(dim=-1) == target).all())
        return (total, greedy), report

    # ---------------------------------------------------------------- generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out: list[str] = []
        with self._bar(len(requests), "polykv: generate_until requests", disable_tqdm) as bar:
            for request in requests:
                self._gen_tag = _tag(request, "generate_until")
                try:
                    out.extend(super().generate_until([request], disable_tqdm=True))
                finally:
                    self._gen_tag = None
                bar.update(1)
        return out

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        """lm-eval's generation call inside the runtime: the prompt's prefill is compressed, decoding evicts."""
        with self._runtime() as runtime:
            tokens = super()._model_generate(context, max_length, stop, **generation_kwargs)
            self._record(self._gen_tag, runtime.report())
        return tokens

    # --------------------------------------------------------------------- report
    def kv_summary(self) -> dict[str, Any]:
        """The strategy and KV bytes held per request (means; ``kv_ratio`` = kv / FullKV), overall and per task."""
        return {
            "strategy": self.strategy_name,
            "strategy_digest": self.strategy.digest(),
            "global_budget": self.strategy.global_budget,
            "solver": self.strategy.provenance.get("solver"),
            "decode_interval": self.decode_interval,
            "interval_mode": self.interval_mode,
            "protocol": PROTOCOL,
            **_means(self.kv_log),
            "tasks": {task: _means([r for r in self.kv_log if r.task == task]) for task in _tasks(self.kv_log)},
        }

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info[MODEL_NAME] = summary = self.kv_summary()
        if summary["requests"]:
            log.info(
                "polykv: %s held %.3f MiB of KV per request on average, %.1f%% of FullKV (%d requests)",
                self.strategy_name,
                summary["kv_bytes"] / 2**20,
                100 * (summary["kv_ratio"] or 0.0),
                summary["requests"],
            )
        return info


def _tasks(records: list[KVRecord]) -> list[str]:
    return sorted({r.task for r in records if r.task is not None})


def _means(records: list[KVRecord]) -> dict[str, Any]:
    n = len(records)
    kv = sum(r.kv_bytes for r in records) / n if n else None
    full = sum(r.full_kv_bytes for r in records) / n if n else None
    return {"requests": n, "kv_bytes": kv, "full_kv_bytes": full, "kv_ratio": kv / full if full else None}
