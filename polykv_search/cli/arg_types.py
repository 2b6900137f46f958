"""argparse ``type=`` callables: numbers that refuse NaN, infinities and out-of-range values, bounded counts,
comma lists that refuse empty and repeated items, and pattern specs checked for syntax.

A refusal is an :class:`argparse.ArgumentTypeError`, which the parser turns into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from solvers.settings import MAX_SEED


def _number(text: str, kind: Callable[[str], Any], what: str) -> Any:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _int_at_least(text: str, least: int, what: str) -> int:
    value = _number(text, int, what)
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def at_most(most: int, unit: str, *, zero: bool = False):
    """An argparse type: a positive integer (``zero``: or 0) of at most ``most`` (``unit``: what it counts)."""

    def parse(text: str) -> int:
        value = non_negative_int(text) if zero else positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"expected at most {most:,} {unit}, got {value:,}")
        return value

    return parse


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, counts that may be zero)."""
    return _int_at_least(text, 0, "a non-negative integer")


def seed_value(text: str) -> int:
    """A seed: an integer in 0 .. :data:`~solvers.settings.MAX_SEED`, which every generator here takes."""
    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed of at most {MAX_SEED:,}, got {value:,}")
    return value


def finite_float(text: str) -> float:
    """Any finite number (NaN and infinities refused)."""
    return _number(text, float, "a finite number")


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (e.g. a sampling temperature, where 0 means greedy)."""
    value = _number(text, float, "a finite number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number >= 1 (budgets: at least one token per layer)."""
    value = _number(text, float, "a finite number >= 1")
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 1, got {text!r}")
    return value


def jobs_count(text: str) -> str | int:
    """``--jobs``: ``auto`` or a positive count."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}") from None


def comma_list(
    cast: Callable[[str], Any] = str, what: str = "item", split: Callable[[str], list[str]] | None = None
) -> Callable[[str], list]:
    """An argparse type: ``a,b,c`` -> ``[cast(a), cast(b), cast(c)]``; empty lists and empty items are refused.

    ``cast`` may be ``int``, one of the types above (``positive_int``), or any callable raising
    ``ValueError`` / ``argparse.ArgumentTypeError``; ``what`` names one item in messages; ``split`` replaces
    the plain split at commas (pattern specs keep the commas inside their brackets)."""

    def parse(text: str) -> list:
        items = [x.strip() for x in (split(text) if split else text.split(","))]
        if not any(items):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}s, got {text!r}")
        if not all(items):
            raise argparse.ArgumentTypeError(f"empty {what} in {text!r}")
        values = []
        for item in items:
            try:
                values.append(cast(item))
            except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
                detail = str(err) if isinstance(err, argparse.ArgumentTypeError) else f"not a valid {what}"
                where = f"{item!r} in {text!r}: " if len(items) > 1 else ("" if item in detail else f"{item!r}: ")
                raise argparse.ArgumentTypeError(f"{where}{detail}") from None
        if len(set(map(repr, values))) != len(values):
            raise argparse.ArgumentTypeError(f"repeated {what} in {text!r}")
        return values

    parse.__name__ = f"list of {what}s"  # argparse shows it in "invalid <name> value"
    return parse


def pattern_spec_text(text: str) -> str:
    """One pattern spec, ``NAME`` or ``NAME[KEY=VALUE,...]``, checked for syntax (an unclosed bracket, a
    parameter given twice); the name is checked where the command knows which patterns it takes."""
    from polykv_search.patterns.spec import parse_spec

    try:
        parse_spec(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def pattern_specs(what: str = "pattern") -> Callable[[str], list]:
    """An argparse type: comma-separated pattern specs (commas inside brackets kept), each checked by
    :func:`pattern_spec_text`, so a malformed spec is an argparse refusal (one line) before anything runs."""
    from polykv_search.patterns.spec import split_specs

    return comma_list(pattern_spec_text, what, split=split_specs)
