"""The ``polykv-search`` command line: one module per command."""

from __future__ import annotations

import argparse
import importlib
import sys

from polykv_search import __version__

#: command modules, in the order `--help` lists them
COMMANDS = ("quickstart", "generate", "collect", "solve", "score", "compare", "show", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polykv-search",
        description="Find, apply and export layer-wise KV-cache eviction strategies (PolyKV).",
    )
    parser.add_argument("--version", action="version", version=f"polykv-search {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"polykv_search.cli.{name}").add_parser(sub)
    return parser




def main(argv: list[str] | None = None) -> int:
    from polykv_search.cli.common import console, user_errors

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except user_errors() as err:
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
