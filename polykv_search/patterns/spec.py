"""Pattern specs: a pattern name with parameters, as one string (``kvzip[allocation=model]``).

A spec names a grid column in ``collect`` and a candidate the solvers may choose, so that a variant of a
pattern (KVzip's own pooled allocation, a SnapKV with another window) is a pattern of its own there. The
bare name is the pattern with its literature defaults. The label written back is canonical: the
parameters that differ from the defaults, in the order given.

>>> parse_spec("kvzip[allocation=model]")
('kvzip', {'allocation': 'model'})
>>> parse_spec("kvzip[allocation=model,weight=2/0.5/1]")
('kvzip', {'allocation': 'model', 'weight': (2, 0.5, 1)})
>>> split_specs("snapkv,kvzip[allocation=model,chunk_size=256]")
['snapkv', 'kvzip[allocation=model,chunk_size=256]']
"""

from __future__ import annotations

import re
from typing import Any

from strategies.choice import spec_label

_SPEC = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(.*)\])?")


def parse_value(text: str) -> Any:
    """A parameter from text: an integer, a number, true/false, numbers joined by ``/`` (a tuple: one value per KV
    head, ``weight=2/0.5/1``), or the text itself."""
    if "/" in text:
        parts = [parse_value(p.strip()) for p in text.split("/")]
        numeric = all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts)
        return tuple(parts) if numeric else text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_params(text: str) -> dict[str, Any]:
    """``KEY=VALUE,...`` as a dict (``ValueError`` naming the bad item)."""
    params: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"pattern parameters are KEY=VALUE, got {item!r}")
        if key.strip() in params:
            raise ValueError(f"parameter {key.strip()!r} is given twice in {text!r}")
        params[key.strip()] = parse_value(value.strip())
    return params


def parse_spec(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME[KEY=VALUE,...]`` as ``(name, params)``; the name is not checked here."""
    match = _SPEC.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"a pattern is NAME or NAME[KEY=VALUE,...], got {text!r}")
    return match.group(1), parse_params(match.group(2) or "")


def split_specs(text: str) -> list[str]:
    """Split a comma-separated list of specs at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return items


__all__ = ["parse_params", "parse_spec", "parse_value", "spec_label", "split_specs"]
