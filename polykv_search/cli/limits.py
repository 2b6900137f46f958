"""Limits a run is checked against before its model loads: the model's positions, this machine's memory, and
the cluster a ``--backend`` names.

A run that cannot fit is refused in one line (exit 2) instead of stalling for minutes in an attention call or
failing after the model loaded:

- :func:`check_lengths`: the longest sequence a run builds (``--context-len`` plus the tokens generated or
  teacher-forced after it) against the model's ``max_position_embeddings``, read from its ``config.json``
  without loading weights (:func:`model_shape`), and a rough lower bound of the memory one such sequence
  holds (its full KV cache, and with ``--attn eager`` one layer's attention matrix) against the memory
  available here;
- :func:`check_backend`: ``--backend dask|ray`` whose package is missing, or whose ``--address`` does not
  answer within :data:`CONNECT_SECONDS`.
"""

from __future__ import annotations

import importlib.util
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from polykv_search.cli.arg_types import at_most
from polykv_search.cli.common import CLIError, resolve_jobs
from polykv_search.models import MAX_CONTEXT_LEN

#: seconds a cluster address has to accept a connection
CONNECT_SECONDS = 3.0
#: A length flag (``--context-len``, ``--continuation-len``, ``--max-new-tokens``, ...): a positive count of at most
#: :data:`~polykv_search.models.MAX_CONTEXT_LEN` tokens, refused by argparse; the model's own window, where its config
#: is at hand, is :func:`check_lengths`'s.
token_count = at_most(MAX_CONTEXT_LEN, "tokens")
#: bytes per element of each ``--dtype``
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: hidden-size buffers a forward holds per token besides the cache (residual, norms, q/k/v/o, MLP), roughly
ACTIVATION_BUFFERS = 8


@dataclass(frozen=True)
class ModelShape:
    """What the limits need of a model's config (``None``: not in the config)."""

    name: str
    max_positions: int | None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden: int | None = None

    @classmethod
    def from_config(cls, name: str, config: dict[str, Any]) -> ModelShape:
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

        def num(key: str) -> int | None:
            value = text.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

        heads, hidden = num("num_attention_heads"), num("hidden_size")
        head_dim = num("head_dim") or (hidden // heads if hidden and heads else None)
        return cls(
            name,
            num("max_position_embeddings"),
            num("num_hidden_layers"),
            heads,
            num("num_key_value_heads") or heads,
            head_dim,
            hidden,
        )

    def bytes_at(self, tokens: int, dtype: str, attn: str) -> int | None:
        """A rough lower bound of the memory one ``tokens``-long sequence holds: its full KV cache and a few
        hidden-size buffers per token; with ``eager`` attention one layer's ``heads × tokens²`` scores too."""
        if None in (self.layers, self.kv_heads, self.head_dim, self.hidden):
            return None
        size = DTYPE_BYTES.get(dtype, 4)
        kv = 2 * self.layers * self.kv_heads * self.head_dim * tokens * size  # type: ignore[operator]
        activations = ACTIVATION_BUFFERS * self.hidden * tokens * size  # type: ignore[operator]
        scores = (self.heads or 1) * tokens * tokens * size if attn == "eager" else 0
        return kv + activations + scores


def model_shape(name: str) -> ModelShape | None:
    """The shape of model ``name`` from its ``config.json``, read without loading weights; for a built-in
    model not yet converted, its known context length; None when no config is at hand (a hub id not cached)."""
    from polykv_search.models import BUILTIN_MODELS, cached_config, resolve_model

    source = resolve_model(name)
    path = cached_config(source)
    if path is not None:
        try:
            return ModelShape.from_config(source.name, json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, AttributeError):
            pass  # an unreadable config is the loader's to report
    if source.kind == "builtin":
        return ModelShape(source.name, BUILTIN_MODELS[source.location].context_length)
    return None


def check_lengths(
    shape: ModelShape | None,
    *,
    context_len: int,
    after: int,
    after_flag: str,
    dtype: str = "float32",
    attn: str = "sdpa",
    device: str = "cpu",
    workers: int = 1,
    context_flag: str = "--context-len {}",
) -> None:
    """Refuse a run whose longest sequence (``context_len`` + ``after`` tokens, ``context_flag`` and ``after_flag``
    naming them) exceeds the model's positions, or needs more memory than is available here (one :class:`CLIError`
    line)."""
    if shape is None:
        return
    total = context_len + after
    parts = context_flag.format(context_len) + (f" + {after} {after_flag}" if after else "")
    if shape.max_positions is not None and total > shape.max_positions:
        raise CLIError(
            f"{parts} = {total} positions, over the {shape.max_positions} of {shape.name} "
            f"(max_position_embeddings); {_shorter(shape.max_positions, after)}"
        )
    need = shape.bytes_at(total, dtype, attn)
    have = _memory(device)
    if need is None or have is None or need * workers <= have:
        return
    fits = _longest(shape, dtype, attn, have // workers)
    per = f" in each of {workers} workers" if workers > 1 else ""
    raise CLIError(
        f"{parts} = {total} tokens hold at least {need / 2**30:.1f} GiB{per} (the KV cache of {shape.name} in "
        f"{dtype}{', eager attention scores' if attn == 'eager' else ''}), over the {have / 2**30:.1f} GiB available "
        f"on {device}; at most about {fits} tokens fit"
    )


def check_fits_model(strategies: list, model: str) -> None:
    """Refuse a strategy (``(path, Strategy)`` pairs) whose layer count, or with head groups KV head count, is
    not the model's, read from its ``config.json`` without loading weights (no config at hand: left to the
    check after the model loads)."""
    from strategies import StrategyError

    shape = model_shape(model)
    if shape is None or shape.layers is None:
        return
    for path, s in strategies:
        if s.first_head_groups() is not None and shape.kv_heads is None:
            continue
        try:
            s.check_model(shape.layers, shape.kv_heads)
        except StrategyError as err:
            raise CLIError(f"{path}: {err} ({shape.name})") from None


def _shorter(limit: int, after: int) -> str:
    if after < limit:
        return f"give at most {limit - after} context tokens"
    return f"what follows the context alone needs {after}; give fewer"


def _longest(shape: ModelShape, dtype: str, attn: str, budget: int) -> int:
    """The longest sequence whose :meth:`ModelShape.bytes_at` fits ``budget`` bytes (bisection)."""
    low, high = 0, 1
    while (shape.bytes_at(high, dtype, attn) or 0) <= budget:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if (shape.bytes_at(mid, dtype, attn) or 0) <= budget else (low, mid)
    return low


def _memory(device: str) -> int | None:
    """Bytes a run may use on ``device``: the available memory on a CPU, the accelerator's total on CUDA."""
    from polykv_search.parallel import available_memory

    if str(device).split(":")[0] == "cpu":
        return available_memory()
    try:
        import torch

        if str(device).startswith("cuda") and torch.cuda.is_available():
            index = int(str(device).partition(":")[2] or 0)
            return int(torch.cuda.get_device_properties(index).total_memory)
    except (ImportError, RuntimeError, ValueError, AssertionError):
        pass
    return None


# --------------------------------------------------------------------------------------------
# Local workers

#: the fewest workers an explicit ``--jobs N`` is clamped to: a fan-out (``--backend loky``) needs two
MIN_JOBS_LIMIT = 2


def jobs_limit() -> tuple[int, str]:
    """``(most, why)``: the most local worker processes an explicit ``--jobs N`` starts, as
    :func:`polykv_search.parallel.auto_jobs` counts them (one per usable core, as many as the available memory
    holds at :data:`~polykv_search.parallel.WORKER_BYTES` each) but at least :data:`MIN_JOBS_LIMIT`; ``why``
    says what bounds it, for the notice."""
    from polykv_search import parallel

    cores, memory, each = parallel.usable_cores(), parallel.available_memory(), parallel.WORKER_BYTES
    fits = cores if memory is None else int(memory // each)
    why = f"{cores} usable CPU cores"
    if memory is not None:
        why += f", {memory / 2**30:.1f} GiB available at {each / 2**30:g} GiB a worker"
    return max(MIN_JOBS_LIMIT, min(cores, fits)), why


# --------------------------------------------------------------------------------------------
# Cluster back-ends

_INSTALL = {"dask": "dask.distributed (pip install 'dask[distributed]')", "ray": "ray (pip install 'ray[default]')"}
#: each back-end's importable package and the port its addresses default to
_PACKAGE = {"dask": "distributed", "ray": "ray"}
_PORT = {"dask": 8786, "ray": 6379}
#: the default port of an address with a scheme (a ray client's ``ray://``)
_SCHEME_PORT = {"tcp": 8786, "tls": 8786, "ray": 10001}


def check_fan_out_flags(args) -> None:
    """``--jobs`` resolved (``auto``, the clamp) and ``--backend``/``--address``/``--jobs`` checked together
    (``score`` and ``collect``); the back-end itself is :func:`check_backend`."""
    resolve_jobs(args)
    if args.address is not None and not args.address.strip():  # "" would silently start a local cluster
        raise CLIError("--address: empty; give HOST:PORT, or leave it out for a local cluster")
    if args.address and not args.backend:
        raise CLIError("--address applies to --backend dask or ray; give --backend")
    if args.address and args.backend == "loky":
        raise CLIError("--address does not apply to --backend loky (local processes)")
    if args.address == "auto" and args.backend == "dask":  # ray's word; dask would look for a host named auto
        raise CLIError(
            "--address auto finds a running ray cluster; --backend dask needs its scheduler's address "
            "(HOST:PORT or tcp://HOST:PORT), or no --address for a local cluster"
        )
    if args.backend == "loky" and args.jobs == 1:
        raise CLIError("--backend loky runs --jobs worker processes; give --jobs 2 or more")


def check_backend(backend: str | None, address: str | None) -> None:
    """Refuse ``--backend dask|ray`` when its package is not installed, or when ``--address`` does not accept a
    connection within :data:`CONNECT_SECONDS` (a dask scheduler, a ray head); ``--address auto`` (ray's search
    for a running cluster) is left to ray."""
    if backend not in _PACKAGE:
        return
    if importlib.util.find_spec(_PACKAGE[backend]) is None:
        raise CLIError(f"--backend {backend} needs {_INSTALL[backend]}")
    if not address or address == "auto":
        return
    where = _host_port(address, _PORT[backend] if "://" not in address else _SCHEME_PORT.get(address.split(":")[0], 0))
    if where is None:
        raise CLIError(f"--address {address}: expected HOST:PORT or SCHEME://HOST:PORT")
    try:
        with socket.create_connection(where, timeout=CONNECT_SECONDS):
            pass
    except OSError as err:
        reason = f"no answer within {CONNECT_SECONDS:g} s" if isinstance(err, TimeoutError) else err.strerror
        reason = reason or type(err).__name__
        what = "dask scheduler" if backend == "dask" else "ray cluster"
        raise CLIError(
            f"--address {address}: no {what} answers there ({reason}); start one, "
            f"or leave out --address for a local cluster"
        ) from None


def _host_port(address: str, default_port: int) -> tuple[str, int] | None:
    """``(host, port)`` of ``tcp://host:port``, ``ray://host:port`` or ``host:port``; None when unparsable."""
    try:
        parts = urlsplit(address if "://" in address else f"tcp://{address}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    port = port or default_port
    return (host, port) if host and port else None
