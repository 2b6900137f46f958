"""Provenance: a short hash of a model's name and architecture config."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

#: Config fields that describe how a model is run or where it was loaded from, not what it is.
_VOLATILE_CONFIG_KEYS = frozenset(
    {
        "architectures",
        "dtype",
        "torch_dtype",
        "transformers_version",
        "use_cache",
        "quantization_config",
        "attn_implementation",
        "name_or_path",
    }
)


def model_fingerprint(model) -> str:
    """A short (12 hex digits) hash of the model's name and architecture config, for provenance.

    It ignores how the model is run (dtype, device, attention implementation, cache flags) and where
    it was loaded from, so the same model gives the same fingerprint on CPU/fp32 and CUDA/bf16. The
    name is the :class:`ModelSource` name for models from :func:`load_model`, else the last
    component of ``config.name_or_path``. The weights themselves are not hashed."""
    config = model.config
    source = getattr(model, "polykv_source", None)
    if source is not None:
        name = source.name
    else:
        raw = str(getattr(config, "name_or_path", "") or "")
        name = Path(raw).name if os.path.isabs(raw) or raw.startswith(".") else raw
    fields = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS}
    payload = json.dumps({"name": name, "config": fields}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
