"""Shared CLI plumbing: the one-line error boundary's types, output checks, the console.

Every command refuses bad input the same way: one line on stderr, exit code 2, nothing written. The
helpers here make that a one-liner in a command module:

- argparse ``type=`` callables (:mod:`polykv_search.cli.arg_types`) that refuse NaN, infinities, negatives and
  empty list items;
- :func:`check_output_path`, called before a model is loaded, so a bad ``--out`` fails in a second,
  not after the whole run;
- :func:`read_text` / :func:`read_json`, which name the file when it cannot be read or decoded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from rich.console import Console

from polykv_search import io
from polykv_search.cli.arg_types import positive_int

console = Console(stderr=True)
out = Console()


class CLIError(Exception):
    """Bad input: printed as one line, exit code 2."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C with something to say (where the finished work is): ``interrupted: MESSAGE``, exit 130."""


#: The exception types the library raises for bad input, by class name; shown as one line, exit 2.
USER_ERROR_NAMES = frozenset(
    {
        "StrategyError",  # strategies: schema, budgets
        "ExportError",  # strategies.exporters
        "UnsupportedModelError",  # polykv_search.runtime
        "ModelError",  # polykv_search.models
        "DataError",  # polykv_search.data
        "ScoreError",  # polykv_search.scoring
        "CompareError",  # polykv_search.compare
        "LongBenchDataError",  # polykv_search.evaluation.longbench
        "SignalTableError",  # signals
        "CollectError",  # signals.collect
        "JournalError",  # signals.journal
        "SolverError",  # solvers
    }
)
#: the packages whose modules may define them
_PACKAGES = ("polykv_search", "strategies", "signals", "solvers")


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "the user gave us something wrong".

    Looked up by name in the project's modules already imported (one that never ran cannot have
    raised), so an error type may move between modules without this list changing."""
    errors: dict[type[BaseException], None] = {CLIError: None}
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".", 1)[0] not in _PACKAGES:
            continue
        namespace = getattr(module, "__dict__", {})  # not getattr(): lazy module __getattr__ would import
        for name in USER_ERROR_NAMES:
            cls = namespace.get(name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                errors[cls] = None
    return tuple(errors)


def one_line(text: str) -> str:
    """``text`` on one line: its non-empty lines joined, runs of blanks collapsed."""
    return " ".join(" ".join(line.split()) for line in str(text).splitlines() if line.strip())


def describe_os_error(err: OSError) -> str:
    """``cannot use PATH: reason`` for an :class:`OSError` that names a file."""
    reason = err.strerror or one_line(str(err)) or type(err).__name__
    if isinstance(err, FileExistsError):  # os.makedirs met a file where a folder must go
        reason = "exists and is not a directory"
    target = f"{err.filename} -> {err.filename2}" if err.filename2 else str(err.filename)
    return f"cannot use {target}: {reason}"


def describe_decode_error(err: UnicodeDecodeError, path: str | os.PathLike | None = None) -> str:
    where = f"{os.fspath(path)}: " if path is not None else "an input file: "
    return f"{where}not UTF-8 text ({err.reason} at byte {err.start}); give a UTF-8 text or JSON file"


# --------------------------------------------------------------------------------------------
# Model options


class ParagraphHelpFormatter(argparse.HelpFormatter):
    """A long description (a module docstring) filled paragraph by paragraph to the terminal's width, the blank
    lines between paragraphs kept (``RawDescriptionHelpFormatter`` would print its 100-column lines as written)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
        return "\n\n".join(
            textwrap.fill(p, width, initial_indent=indent, subsequent_indent=indent) for p in paragraphs if p
        )


def add_model_args(p: argparse.ArgumentParser) -> None:
    from polykv_search.models import DEFAULT_MODEL

    g = p.add_argument_group("model")
    g.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"HF model id, local path, or {DEFAULT_MODEL!r} (default, offline)"
    )
    g.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    g.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="float32 (default), bfloat16, float16",
    )
    g.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention kernel (default sdpa)")


def add_decode_interval_args(p: argparse.ArgumentParser, *, default: int | None, help: str) -> None:
    """``--decode-interval`` and ``--interval-mode`` (see :class:`~polykv_search.runtime.PolyKVRuntime`)."""
    p.add_argument("--decode-interval", type=positive_int, default=default, help=help)
    p.add_argument(
        "--interval-mode",
        choices=("within", "over"),
        default="within",
        help="with --decode-interval k: 'within' never holds more than the budget (evicts down to "
        "budget - k + 1; default), 'over' holds up to budget + k - 1",
    )


def add_protocol_arg(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--question-aware``: the protocol of :mod:`polykv_search.protocol` (default question-agnostic)."""
    p.add_argument(
        "--question-aware",
        action="store_true",
        help=help
        or "question-aware protocol: prefill context and question as one prompt and compress them together "
        "(kvpress's compress_questions; the KVCache-Factory setting); default question-agnostic: the context "
        "is compressed, the question follows uncompressed. Recorded in the results; teacher-forced tasks "
        "(continuation) have no question and are the same under both; the decode suite is refused",
    )


def check_model_args(args: argparse.Namespace) -> None:
    """Refuse a bad ``--model`` / ``--device`` in a moment, before anything slow runs."""
    from polykv_search.models import parse_device, resolve_model

    resolve_model(args.model)
    parse_device(args.device)


def load_model_from_args(args: argparse.Namespace):
    from transformers.utils import logging as hf_logging

    from polykv_search.models import load_model

    hf_logging.disable_progress_bar()
    with console.status(f"loading {args.model} ..."):
        return load_model(args.model, device=args.device, dtype=args.dtype, attn_implementation=args.attn)


# --------------------------------------------------------------------------------------------
# Inputs


def read_text(path: str | os.PathLike, flag: str | None = None) -> str:
    """The UTF-8 text of ``path`` (a ``.xz`` or ``.gz`` file decompressed); :class:`CLIError` naming the file (and
    ``flag``) when it cannot be read."""
    label = f"{flag} {os.fspath(path)}" if flag else os.fspath(path)
    try:
        return io.read_text(path)
    except UnicodeDecodeError as err:
        raise CLIError(describe_decode_error(err, label)) from None
    except OSError as err:
        raise CLIError(f"cannot read {label}: {err.strerror or one_line(str(err))}") from None


def read_json(path: str | os.PathLike, flag: str | None = None) -> Any:
    """The JSON document in ``path``; :class:`CLIError` naming the file when it is not JSON.

    NaN and infinities (which Python's ``json`` would accept) are refused: no file this project
    writes holds them."""
    label = f"{flag} {os.fspath(path)}" if flag else os.fspath(path)
    text = read_text(path, flag)

    def refuse(token: str) -> float:
        raise CLIError(f"{label}: {token} is not a valid JSON number")

    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as err:
        raise CLIError(f"{label}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise CLIError(f"{label}: JSON nested too deeply") from None


# --------------------------------------------------------------------------------------------
# Outputs


def check_output_path(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Refuse an output path that cannot be written, before any work is done.

    ``path`` must not be a directory; its nearest existing ancestor must be a directory in which a
    file can be created (so the missing folders can be made). Probed with a real temporary file,
    so read-only filesystems and permissions are seen as the writer will see them. Creates nothing
    that stays. Returns ``Path(path)``.

    Raises
    ------
    CLIError
        One line naming ``flag`` and the path.
    """
    target = Path(path)
    if not os.fspath(path).strip():
        raise CLIError(f"{flag}: empty path")
    if target.is_dir():
        raise CLIError(f"{flag} {target}: is a directory; give a file name")
    if os.fspath(path).endswith(("/", os.sep)):  # Path() drops the slash: o.json/ would be written as o.json
        raise CLIError(f"{flag} {os.fspath(path)}: ends in a slash, as a folder does; give a file name")
    if target.name in ("", ".", ".."):
        raise CLIError(f"{flag} {target}: not a file name")
    ancestor = target.absolute().parent
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link cannot be made into a folder
            raise CLIError(f"{flag} {target}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise CLIError(f"{flag} {target}: {ancestor} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".polykv-probe.", suffix=".tmp", dir=ancestor)
    except OSError as err:
        raise CLIError(f"{flag} {target}: cannot write in {ancestor}: {err.strerror or one_line(str(err))}") from None
    os.close(fd)
    os.unlink(probe)
    return target


def check_output_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Refuse an output folder that is a file or cannot be created or written; creates nothing."""
    if not os.fspath(path).strip():  # Path("") is the working directory
        raise CLIError(f"{flag}: empty path")
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise CLIError(f"{flag} {target}: exists and is not a directory")
    check_output_path(target / ".polykv-probe", flag)
    return target


def resolve_jobs(args: argparse.Namespace) -> int:
    """``args.jobs`` as a count (``auto``: :func:`polykv_search.parallel.auto_jobs` for ``args.device``), set on
    ``args`` and returned. A count of local workers above what this machine holds
    (:func:`polykv_search.cli.limits.jobs_limit`: its cores and memory) is clamped to it, with a one-line notice;
    a cluster's workers (``--backend dask|ray --address``) are the cluster's business."""
    from polykv_search.cli.limits import jobs_limit
    from polykv_search.parallel import auto_jobs

    if args.jobs == "auto":
        args.jobs = auto_jobs(args.device)
    elif args.jobs > 1 and not getattr(args, "address", None):
        most, why = jobs_limit()
        if args.jobs > most:
            console.print(
                f"note: --jobs {args.jobs} clamped to {most}, the most worker processes this machine holds ({why})",
                highlight=False,
                soft_wrap=True,
            )
            args.jobs = most
    return args.jobs


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
