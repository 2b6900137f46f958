"""Pattern state of a row group: the rows' states stacked into one, and one row's part taken back.

Conventions (those of :mod:`polykv_search.patterns.base`): token-axis tensors live under
``state["token"]`` (``[B, H, n]``, gathered with the cache); other tensors are batch-first
``[B, ...]``; anything else (e.g. a ``range`` of query positions) is the same for every row of a group.
"""

from __future__ import annotations

from typing import Any

import torch


def fit_tokens(t: torch.Tensor, n: int) -> torch.Tensor:
    """A token-axis tensor cut or zero-padded to ``n`` slots (cut slots are padding, so zero)."""
    if t.shape[-1] == n:
        return t
    if t.shape[-1] > n:
        return t[..., :n].contiguous()
    return torch.nn.functional.pad(t, (0, n - t.shape[-1]))


def stack_states(states: list[dict], counts: list[int]) -> dict:
    """One group state from the rows' states: token tensors zero-padded to the longest row and
    stacked, other batch-first tensors stacked, everything else equal across rows (taken once)."""
    keys = set(states[0])
    if any(set(s) != keys for s in states):
        raise ValueError("rows of a group have different pattern states")
    n = max(counts)
    out: dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in states]
        if key == "token":
            out[key] = {name: torch.cat([fit_tokens(v[name], n) for v in values]) for name in values[0]}
        elif isinstance(values[0], torch.Tensor):
            if any(v.dim() < 2 or v.shape[0] != 1 for v in values):
                raise ValueError(f"pattern state {key!r} is not a per-row [1, ...] tensor")
            out[key] = torch.cat(values)
        elif all(v == values[0] for v in values):
            out[key] = values[0]
        else:
            raise ValueError(f"rows of a group disagree on pattern state {key!r}")
    return out


def row_state(state: dict, rows: int, j: int, count: int) -> dict:
    """Row ``j``'s part of a group state (the inverse of :func:`stack_states`)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key == "token":
            out[key] = {name: t[j : j + 1, :, :count] for name, t in value.items()}
        elif isinstance(value, torch.Tensor) and value.dim() > 1 and value.shape[0] == rows:
            out[key] = value[j : j + 1]
        else:
            out[key] = value
    return out
