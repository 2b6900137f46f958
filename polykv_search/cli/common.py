"""Shared CLI plumbing: one-line errors with exit code 2, common options, the console."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)
out = Console()


class CLIError(Exception):
    """Bad input: printed as one line, exit code 2."""


#: Exceptions that mean "the user gave us something wrong"; shown as one line, exit 2.
def user_errors() -> tuple[type[BaseException], ...]:
    from polykv_search.runtime import UnsupportedModelError
    from strategies import StrategyError

    errors: list[type[BaseException]] = [CLIError, StrategyError, UnsupportedModelError]
    for module, name in [
        ("polykv_search.models", "ModelError"),
        ("polykv_search.data", "DataError"),
        ("solvers", "SolverError"),
        ("signals", "SignalTableError"),
    ]:
        try:
            errors.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def add_model_args(p: argparse.ArgumentParser) -> None:
    from polykv_search.models import DEFAULT_MODEL

    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"HF model id, local path, or {DEFAULT_MODEL!r} (default, offline)")
    g.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    g.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16")
    g.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention kernel (default sdpa)")


def load_model_from_args(args: argparse.Namespace):
    from transformers.utils import logging as hf_logging

    from polykv_search.models import load_model

    hf_logging.disable_progress_bar()
    with console.status(f"loading {args.model} ..."):
        return load_model(args.model, device=args.device, dtype=args.dtype, attn_implementation=args.attn)


def read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise CLIError(f"cannot read {path}: {err.strerror}") from None


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value
