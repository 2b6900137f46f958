"""Cosine collector: how close layer l's output on the continuation stays to FullKV's.

cosine(cell) = mean over the continuation's m positions of cos(y_cell[t], y_full[t]), where y is the
output (residual stream) of the cell's layer l; averaged over calibration samples by the driver.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cosine_per_token(outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Cosine similarity per row and position: ``outputs`` ``[C, m, d]`` (one row per cell),
    ``reference`` ``[1 or C, m, d]`` (FullKV); returns float64 ``[C, m]``."""
    return F.cosine_similarity(outputs.double(), reference.double().expand_as(outputs), dim=-1, eps=1e-12)


def cosine_per_row(outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity over positions, per row: float64 ``[C]``."""
    return cosine_per_token(outputs, reference).mean(dim=-1)
