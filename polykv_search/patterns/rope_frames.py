"""RoPE frames for patterns that keep query statistics: queries rotated back to their pre-RoPE frame,
and keys rotated back by the mean rotation of positions ahead.

Both are derived from the ``(cos, sin)`` a layer's :meth:`~polykv_search.patterns.base.LayerView.rotary_cos_sin`
returns (``x * cos + rotate_half(x) * sin`` rotates ``x``), written as ``x * a + swap(x) * b`` with
``swap(x) = cat(x[D/2:], x[:D/2])`` (``rotate_half(x) = swap(x) * [-1, .., -1, 1, .., 1]``). The
runtime's rotary embedding answers every layer of a decoding step with the same tensors, so the
coefficients are remembered by the identity (and version) of those tensors, for the few most recent
ones: computed once per step, not once per layer.
"""

from __future__ import annotations

import threading

import torch

#: coefficient sets remembered (each entry holds its source tensors, so their ids stay unique)
CACHED = 8

_memo: dict[tuple, tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = {}
_lock = threading.Lock()
_latest: dict[str, tuple] = {}  # per kind, the last entry asked for (a read needs no lock)


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    """``cat(x[..., D/2:], x[..., :D/2])``."""
    return x.roll(x.shape[-1] // 2, dims=-1)


def _signed(s: torch.Tensor) -> torch.Tensor:
    """``s`` times the sign of ``rotate_half``: ``rotate_half(x) * s == swap_halves(x) * _signed(s)``."""
    half = s.shape[-1] // 2
    return torch.cat((-s[..., :half], s[..., half:]), dim=-1)


def _version(t: torch.Tensor) -> int | None:
    """The tensor's in-place version counter (inference tensors keep none: they are treated as fixed)."""
    return None if t.is_inference() else t._version


def _remembered(kind: str, cos: torch.Tensor, sin: torch.Tensor, device, build) -> tuple[torch.Tensor, ...]:
    versions = (_version(cos), _version(sin))
    last = _latest.get(kind)  # every layer of a step asks for the same tensors: check the latest first
    if last is not None and last[0] is cos and last[1] is sin and last[2] == versions and last[3] == device:
        return last[4]
    key = (kind, id(cos), id(sin), *versions, str(device))
    with _lock:
        hit = _memo.get(key)
    if hit is not None and hit[0] is cos and hit[1] is sin:
        value = hit[2]
    else:
        value = build(cos.to(device), sin.to(device))
        with _lock:
            while len(_memo) >= CACHED:
                _memo.pop(next(iter(_memo)))
            _memo[key] = (cos, sin, value)
    _latest[kind] = (cos, sin, versions, device, value)  # one assignment: atomic for other threads
    return value


def _unrotation(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c, s = cos.double(), sin.double()
    den = c * c + s * s  # the RoPE type's attention scaling, squared
    return c / den, -_signed(s) / den


def unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., q, D]``, rotated at positions whose ``(cos, sin)`` are ``[q, D]``, rotated back, in
    float64: ``(x * cos - rotate_half(x) * sin) / (cos^2 + sin^2)``."""
    a, b = _remembered("unrotate", cos, sin, x.device, _unrotation)
    x = x.double()
    return torch.addcmul(x * a, swap_halves(x), b)


def _as_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The ``[D, D]`` matrix ``M`` with ``x @ M == x * a + swap_halves(x) * b`` (two non-zeros per column)."""
    idx = torch.arange(a.shape[-1], device=a.device)
    mat = torch.zeros(a.shape[-1], a.shape[-1], dtype=a.dtype, device=a.device)
    mat[idx, idx] = a
    mat[swap_halves(idx), idx] = b
    return mat


def _unrotation_matrix(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor]:
    a, b = (t[0] for t in _unrotation(cos, sin))
    return (_as_matrix(a, b).float(),)  # made in float64, rounded once


def unrotate_one(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, minus: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`unrotate` of ``x`` ``[..., 1, D]`` at one position (``cos``, ``sin`` ``[1, D]``) as one
    product: ``[..., D]`` fp32; less ``minus`` (fp32, ``[..., D]``) when given, in the same op."""
    (mat,) = _remembered("unrotate_one", cos, sin, x.device, _unrotation_matrix)
    flat = x.reshape(-1, x.shape[-1]).float()
    out = torch.mm(flat, mat) if minus is None else torch.addmm(minus.reshape(flat.shape), flat, mat, beta=-1)
    return out.view(*x.shape[:-2], x.shape[-1])


def _back_rotation(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor]:
    return (_as_matrix(cos.mean(0), -_signed(sin.mean(0))),)  # R^T x = c * x + swap_halves(x) * b


def rotate_back(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``R^T x`` for ``x`` ``[..., D]`` (fp32) and ``R`` the mean RoPE rotation of positions whose
    ``(cos, sin)`` are ``[p, D]``: ``R y = c * y + s * rotate_half(y)`` with ``c, s`` the means over the
    positions, so ``R^T x = c * x - s * rotate_half(x)`` (RoPE's ``cos``/``sin`` repeat across the two
    halves, which makes ``s * rotate_half(x)`` equal ``rotate_half(s * x)``), applied as one product with
    a ``[D, D]`` matrix of two non-zeros per column (fewer ops than the elementwise form)."""
    (mat,) = _remembered("ahead", cos, sin, x.device, _back_rotation)
    return torch.matmul(x, mat)
