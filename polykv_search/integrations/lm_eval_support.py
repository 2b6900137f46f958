"""What the lm-eval integration needs before lm-evaluation-harness is imported: its error type, the
check that lm-eval is installed, and the lazy registration of the ``polykv`` model type."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from polykv_search.models import resolve_model
from polykv_search.runtime.layer import INTERVAL_MODES
from polykv_search.scoring.entries import ScoreError
from strategies import Strategy, StrategyError

MODEL_NAME = "polykv"
#: where lm-eval finds the model class (imported only when ``--model polykv`` is used)
MODEL_TARGET = "polykv_search.integrations.lm_eval_model:PolyKVLM"
INSTALL_HINT = "pip install 'polykv-search[lm-eval]'"


class LMEvalError(ScoreError):
    """Bad lm-eval input (lm-eval missing, unknown task, unusable metric): one line, exit code 2."""


def require_lm_eval() -> None:
    """Raise :class:`LMEvalError` unless lm-evaluation-harness and its HF model can be imported."""
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401
    except ImportError as err:
        raise LMEvalError(
            f"lm-eval integration needs lm-evaluation-harness ({err}); install it with: {INSTALL_HINT}"
        ) from None


def register_lazily() -> None:
    """Register ``polykv`` in lm-eval's model registry as a lazy placeholder (lm-eval's own mechanism):
    the model module is imported when a run asks for ``--model polykv``."""
    from lm_eval.api.registry import model_registry

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)


def check_model_args(model_args: Mapping[str, Any]) -> None:
    """Check the ``polykv`` arguments of lm-eval's ``--model_args`` (parsed: ``budget=64`` is ``64``,
    ``budget=nan`` is ``nan``) as the CLI checks its flags, before any model loads.

    ``strategy`` must be ``full``, ``uniform:PATTERN`` with a known pattern and ``budget=B`` (a finite
    positive integer; ``budget`` applies to nothing else), a readable strategy file or a
    :class:`~strategies.Strategy`; ``decode_interval`` a positive integer; ``interval_mode`` one of
    the runtime's; ``pretrained``, when a name or path, one :func:`~polykv_search.models.resolve_model`
    accepts. Raises :class:`~strategies.StrategyError` (a ``ValueError``, as lm-eval's own models
    raise for a bad argument) or :class:`~polykv_search.models.ModelError`, one line each.
    """
    strategy, budget = model_args.get("strategy", "full"), model_args.get("budget")
    if isinstance(strategy, str) and strategy.startswith("uniform:"):
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget):
            raise StrategyError(f"polykv: strategy={strategy} needs budget=B (a positive integer), got {budget!r}")
        if budget < 1 or int(budget) != budget:
            raise StrategyError(f"polykv: budget must be a positive integer, got {budget!r}")
        try:
            Strategy.uniform(1, strategy.partition(":")[2], int(budget))
        except StrategyError as err:
            raise StrategyError(f"polykv: strategy={strategy}: {err}") from None
    elif budget is not None:
        raise StrategyError(f"polykv: budget={budget!r} applies only to strategy=uniform:PATTERN")
    elif isinstance(strategy, str) and strategy != "full":
        if not strategy.strip():
            raise StrategyError("polykv: strategy is empty: give a strategy JSON path, 'full' or 'uniform:PATTERN'")
        Strategy.load(strategy)  # names the file when it cannot be read or is not a strategy
    elif not (strategy is None or isinstance(strategy, (str, Strategy))):
        raise StrategyError(
            f"polykv: strategy must be a strategy JSON path, 'full' or 'uniform:PATTERN', got {strategy!r}"
        )
    interval = model_args.get("decode_interval", 1)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise StrategyError(f"polykv: decode_interval must be a positive integer, got {interval!r}")
    if model_args.get("interval_mode", "within") not in INTERVAL_MODES:
        raise StrategyError(
            f"polykv: interval_mode must be one of {', '.join(INTERVAL_MODES)}, got {model_args['interval_mode']!r}"
        )
    if isinstance(model_args.get("pretrained"), str):
        resolve_model(model_args["pretrained"])
