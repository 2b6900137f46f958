"""``polykv-lm-eval``: lm-evaluation-harness's own command line with the ``polykv`` model registered.

lm-eval 0.4.x finds third-party model types only through its registry, filled by imports (it has
no plugin entry points), so ``lm_eval --model polykv`` cannot work; this command is
``lm_eval`` (same subcommands, flags, output folder and ``--log_samples``) with ``polykv`` registered
as a lazy placeholder (lm-eval imports the model module only when a run asks for it)::

    polykv-lm-eval --model polykv --model_args pretrained=smollm2-135m,strategy=S.json,decode_interval=4 \\
        --tasks hellaswag --limit 100 --output_path runs/ --log_samples

Bad polykv model arguments (a strategy file, a budget, a pattern, an unknown model) are checked after
lm-eval parses its flags and before it runs: one line, ``polykv-lm-eval: error: argument --model_args:
...`` as argparse (and so lm-eval) reports a bad argument, exit code 2, before any log line or model
load. Everything else is lm-eval's own behaviour.
"""

from __future__ import annotations

import sys

from polykv_search.integrations.lm_eval_support import (
    MODEL_NAME,
    LMEvalError,
    check_model_args,
    register_lazily,
    require_lm_eval,
)

#: error types of ours that ``--model_args`` can trigger (matched by name: no import needed to list them)
_USER_ERRORS = ("StrategyError", "ModelError", "UnsupportedModelError", "ScoreError", "LMEvalError")


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's CLI on ``argv`` (default ``sys.argv[1:]``) with ``polykv`` registered; returns the exit code."""
    try:
        require_lm_eval()
    except LMEvalError as err:
        sys.stderr.write(f"polykv-lm-eval: {err}\n")
        return 2
    register_lazily()
    saved = sys.argv
    sys.argv = ["polykv-lm-eval", *(saved[1:] if argv is None else argv)]
    try:
        _evaluate()
    except SystemExit as stop:  # argparse and lm-eval exit this way
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception as err:  # noqa: BLE001 - only our one-line user errors are caught
        if type(err).__name__ not in _USER_ERRORS:
            raise
        sys.stderr.write(f"polykv-lm-eval: error: {' '.join(str(err).split())}\n")
        return 2
    finally:
        sys.argv = saved
    return 0


def _evaluate() -> None:
    """lm-eval's ``cli_evaluate``, with the ``polykv`` model arguments checked between parsing and running.

    A bad one is reported as lm-eval reports a bad ``--model_args`` value (argparse's
    ``PROG: error: argument --model_args: ...``, exit code 2), on one line, before lm-eval logs
    anything or loads a model."""
    try:
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError:  # another lm-eval layout: its own entry point (the model type still checks its arguments)
        from lm_eval.__main__ import cli_evaluate

        return cli_evaluate()
    setup_logging()
    parser = HarnessCLI()
    args = parser.parse_args()
    if getattr(args, "command", None) == "run" and getattr(args, "model", None) == MODEL_NAME:
        try:
            check_model_args(args.model_args or {})
        except Exception as err:  # noqa: BLE001 - only our one-line user errors are reported here
            if type(err).__name__ not in _USER_ERRORS:
                raise
            sys.stderr.write(f"polykv-lm-eval: error: argument --model_args: {' '.join(str(err).split())}\n")
            raise SystemExit(2) from None
    parser.execute(args)


if __name__ == "__main__":
    sys.exit(main())
