"""What the lm-eval integration needs before lm-evaluation-harness is imported: its error type, the
check that lm-eval is installed, and the lazy registration of the ``polykv`` model type."""

from __future__ import annotations

from polykv_search.scoring.entries import ScoreError

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
