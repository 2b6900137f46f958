"""An output that names one of the command's own input files is refused before any work is done.

``solve --signals t.json --out t.json`` would replace a signal table that took hours to collect with a
strategy; ``compare r.json --json r.json`` a results file with its comparison. Writing is atomic, so the
input is read whole first and then lost without a word; these checks make it one line, exit 2.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from polykv_search.cli.common import CLIError


def check_not_an_input(
    out: str | os.PathLike | None, flag: str, inputs: Iterable[tuple[str, str | os.PathLike | None]]
) -> None:
    """Refuse ``out`` (given as ``flag``) when it is the same file as one of ``inputs``: ``(what, path)`` pairs,
    ``what`` naming the input in the message (``"the --signals table"``); ``None`` paths are skipped."""
    if out is None or not os.path.exists(out):
        return
    for what, path in inputs:
        if path is None:
            continue
        try:
            same = os.path.samefile(out, path)
        except OSError:  # an input that cannot be read is its reader's to report
            continue
        if same:
            raise CLIError(f"{flag} {os.fspath(out)} is {what}; writing it would replace that input, give another name")
