"""Loading options: dtype, device and attention implementation, checked before anything is loaded."""

from __future__ import annotations

import torch

from polykv_search.models.sources import ModelError

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or ``fp32``/``bf16``/``fp16``, or a torch dtype)."""
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float32, torch.bfloat16, torch.float16):
            return dtype
    elif isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in _DTYPES:
            return _DTYPES[key]
    raise ModelError(f"invalid dtype {dtype!r}: expected one of float32, bfloat16, float16")


def parse_device(device: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"`` (CUDA if available, else CPU).

    CUDA devices are checked for availability here so a missing GPU is a clear one-line error."""
    if isinstance(device, str) and device.strip().lower() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device.strip().lower() if isinstance(device, str) else device)
    except (RuntimeError, TypeError, ValueError):
        raise ModelError(f"invalid device {device!r}: expected 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(
                f"device {str(dev)!r} requested but CUDA is not available "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ModelError(f"device {str(dev)!r} requested but only {count} CUDA device(s) are visible")
        return dev
    if dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ModelError("device 'mps' requested but MPS is not available")
        return dev
    raise ModelError(f"unsupported device {device!r}: expected 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'")


def _check_attn_implementation(attn_implementation: str) -> str:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # lazy: seconds to import (CLI start-up)

    allowed = ["eager", *ALL_ATTENTION_FUNCTIONS.keys()]
    if not isinstance(attn_implementation, str) or attn_implementation not in allowed:
        raise ModelError(f"invalid attn_implementation {attn_implementation!r}: expected one of {', '.join(allowed)}")
    return attn_implementation
