"""``polykv-lm-eval``: lm-evaluation-harness's own command line with the ``polykv`` model registered.

lm-eval 0.4.x finds third-party model types only through its registry, filled by imports (it has
no plugin entry points), so ``lm_eval --model polykv`` cannot work; this command is
``lm_eval`` (same subcommands, flags, output folder and ``--log_samples``) with ``polykv`` registered
as a lazy placeholder (lm-eval imports the model module only when a run asks for it)::

    polykv-lm-eval --model polykv --model_args pretrained=smollm2-135m,strategy=S.json,decode_interval=4 \\
        --tasks hellaswag --limit 100 --output_path runs/ --log_samples

Bad polykv model arguments (a strategy file, a budget, an unknown model) are one line and exit
code 2; everything else is lm-eval's own behaviour.
"""

from __future__ import annotations

import sys

from polykv_search.integrations.lm_eval_support import LMEvalError, register_lazily, require_lm_eval

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
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["polykv-lm-eval", *(saved[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    except SystemExit as stop:  # argparse and lm-eval exit this way
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception as err:  # noqa: BLE001 - only our one-line user errors are caught
        if type(err).__name__ not in _USER_ERRORS:
            raise
        sys.stderr.write(f"polykv-lm-eval: {' '.join(str(err).split())}\n")
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
