"""The ``polykv-search`` command line: one module per command, one error boundary for all of them.

:func:`main` is the boundary. Bad input of any kind (the library's error types, unreadable or
undecodable input files, unwritable output paths, argparse refusals) becomes one line on stderr and
exit code 2; Ctrl-C at any moment, start-up imports included, exits 130 with one line. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading

#: command modules, in the order `--help` lists them
COMMANDS = ("quickstart", "generate", "collect", "solve", "score", "compare", "show", "export")

#: each command's documentation page (relative to the repository root); its `--help` ends by naming it
DOC_PAGES = {
    "quickstart": "docs/quickstart.md",
    "generate": "docs/runtime.md",
    "collect": "docs/calibration.md",
    "solve": "docs/calibration.md",
    "score": "docs/scoring.md",
    "compare": "docs/scoring.md",
    "show": "docs/calibration.md",
    "export": "docs/runtime.md",
}

#: how deep :func:`main` is nested (quickstart runs the other commands through it)
_depth = 0


class UsageError(Exception):
    """An argparse refusal: one line, a pointer to ``--help``, exit code 2."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{prog}: {message} (see `{prog} --help`)")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose refusals are one line instead of the whole usage block, and that takes no
    abbreviated flags (``--smok`` is refused, not run as ``--smoke``; a later flag cannot change what one means)."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    from polykv_search import __version__

    parser = Parser(
        prog="polykv-search",
        description="Find, apply and export layer-wise KV-cache eviction strategies (PolyKV).",
    )
    parser.add_argument("--version", action="version", version=f"polykv-search {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"polykv_search.cli.{name}").add_parser(sub)
        sub.choices[name].epilog = f"Documentation: {DOC_PAGES[name]} in the polykv-search repository."
    return parser


def _error_line(err: BaseException) -> str | None:
    """The one line a user error is shown as; ``None`` for an exception that is a bug."""
    from polykv_search.cli.common import describe_decode_error, describe_os_error, one_line, user_errors

    if isinstance(err, (UsageError, *user_errors())):
        return one_line(str(err)) or type(err).__name__
    if isinstance(err, UnicodeDecodeError):
        return describe_decode_error(err)
    if isinstance(err, OSError) and err.filename is not None:
        return describe_os_error(err)
    return None


def _print(style: str, label: str, message: str) -> None:
    try:
        from rich.text import Text

        from polykv_search.cli.common import console

        console.print(Text.assemble((label, style), message), soft_wrap=True, highlight=False)
    except KeyboardInterrupt:
        raise
    except Exception:  # noqa: BLE001 - rich itself failed to import: plain stderr still works
        sys.stderr.write(f"{label}{message}\n")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by something without a descriptor
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (0 success, 2 bad input, 130 interrupted)."""
    global _depth
    _depth += 1
    try:
        return _run(argv)
    except KeyboardInterrupt as stop:
        if _depth > 1:  # a nested command: the outer one reports the interruption once
            raise
        _print("yellow", "interrupted", f": {stop}" if str(stop) else "")
        return 130
    finally:
        _depth -= 1


def invoke(argv: list[str], parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command *without* the error boundary: for commands that run other commands.

    Bad input raises (argparse refusals as :class:`UsageError`), so the caller can add context
    to the one line :func:`main` will print, e.g. ``raise CLIError(f"step collect: {err}")``."""
    parser = parser or build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would blame the top-level parser; point at the command's own --help
        prog = f"{parser.prog} {args.command}" if getattr(args, "command", None) else parser.prog
        raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        raise UsageError(parser.prog, "choose a command: " + ", ".join(COMMANDS))
    return int(args.func(args) or 0)


def is_user_error(err: BaseException) -> bool:
    """Whether :func:`main` would show ``err`` as one line (exit 2) rather than a traceback."""
    return _error_line(err) is not None


@contextlib.contextmanager
def _ctrl_c_exits_at_once():
    """While the command modules are imported, Ctrl-C ends the process at once (exit 130).

    A ``KeyboardInterrupt`` raised inside a third-party import is sometimes swallowed by a broad
    ``except`` there, and the import goes on half-done until some later, unrelated traceback.
    Nothing is being written yet, so exiting on the spot is safe. Only in the main thread, and
    only when nobody else has set a SIGINT handler."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def stop(signum, frame):
        os.write(2, b"interrupted\n")
        os._exit(130)

    signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _run(argv: list[str] | None) -> int:
    try:
        if _depth == 1:
            with _ctrl_c_exits_at_once():
                parser = build_parser()
        else:
            parser = build_parser()
        return invoke(argv, parser)  # type: ignore[arg-type]
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    except BrokenPipeError:  # `polykv-search ... | head`: the reader left; say nothing more
        _silence_stdout()
        return 141
    except Exception as err:
        return _user_error_exit(err)


def _user_error_exit(err: Exception) -> int:
    """Print a user error as one line and return exit code 2; re-raise anything else (a bug)."""
    line = _error_line(err)
    if line is None:
        raise err
    _print("red", "error: ", line)
    return 2


def run_script(script_main) -> None:
    """Run a benchmark's or a script's ``script_main()`` behind the commands' error boundary and exit with
    its code: bad input (a model path that does not exist, a malformed strategy or table) is one line on
    stderr and exit 2, as for a command; anything else is a bug and keeps its traceback."""
    try:
        code = script_main()
    except Exception as err:
        code = _user_error_exit(err)
    sys.exit(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
