"""How to deploy a recommended entry: the exact ``polykv-search export`` command for kvpress, or why kvpress
cannot express it and what the Python runtime needs instead.

Whether kvpress can express a strategy is decided by the exporter itself
(:func:`strategies.exporters.render_export`, rendered in memory, nothing written): the exact export first,
then ``--approximate``. An entry scored from a strategy file is exported from that file; a baseline that
``score`` built from a spec (``uniform:PATTERN``, ``pyramid[:PATTERN]``) first gets its file from the
``polykv-search solve`` command that builds the same strategy (same layers, budgets and ``b_min``: the same
digest).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from polykv_search.compare.model import Row, fmt_budget, layers_of
from strategies import Strategy
from strategies.exporters import ExportError, ExportOptions, render_export

#: baselines ``score`` builds from a spec with a solver, which ``solve --method`` runs the same way
SPEC_SOLVERS = ("uniform", "pyramid")
#: the start of an exporter note that says kvpress's press does something else than the scored pattern
DIFFERS = "kvpress differs"
#: the terminal width the verdict and the export commands keep to
WIDTH = 80


@dataclass(frozen=True)
class Deployment:
    """The commands and code that put one entry to use.

    Attributes
    ----------
    strategy_file : str or None
        The strategy JSON to export or load (the scored file, or the one ``make`` writes); None when
        neither is known.
    make : str or None
        The ``polykv-search solve`` command that writes ``strategy_file`` (baselines built from a spec).
    export : str or None
        The exact ``polykv-search export ... --format kvpress`` command; None when kvpress cannot express
        the strategy exactly.
    approximate : str or None
        The export command with ``--approximate`` when only that one is accepted.
    differences : int
        Exporter notes saying where kvpress's presses differ from the scored patterns (listed in the module).
    refusal : str or None
        Why kvpress cannot express the strategy exactly (the exporter's one line).
    runtime : str
        Python that applies the strategy with polykv-search's own runtime (every strategy it scored).
    """

    strategy_file: str | None
    make: str | None
    export: str | None
    approximate: str | None
    differences: int
    refusal: str | None
    runtime: str

    @property
    def command(self) -> str | None:
        """The shell line that writes the kvpress module (the file first where it has to be made)."""
        cmd = self.export or self.approximate
        if cmd is None:
            return None
        return f"{self.make} && {cmd}" if self.make else cmd

    def commands(self) -> list[str]:
        """The shell commands that write the kvpress module, in order (none when kvpress cannot take it)."""
        cmd = self.export or self.approximate
        return [] if cmd is None else [c for c in (self.make, cmd) if c]

    def line(self) -> str:
        """The verdict's third line (at most 80 columns): where the export commands are, or why there are none."""
        n = len(self.commands())
        where = f"the {n} commands under the table" if n > 1 else "the command under the table"
        if self.export:
            return f"kvpress: export it with {where}."
        if self.approximate:
            return f"kvpress, approximated: {where} (it prints every change)."
        if self.refusal:
            return "kvpress cannot express it: apply it with polykv-search's runtime (below)."
        return "No strategy file to export: apply it with polykv-search's runtime (below)."

    def shell(self, width: int = WIDTH) -> list[str]:
        """:meth:`commands` as shell lines of at most ``width`` columns (a long one continued with ``\\``)."""
        return [line for cmd in self.commands() for line in wrap_command(cmd, width)]

    def details(self, markdown: bool = False) -> list[str]:
        """Lines for under the table, after the commands (:meth:`shell`): what kvpress changes or refuses, and
        the Python that applies the strategy with polykv-search's runtime (with ``markdown``: bullets, and the
        Python in a fenced block)."""
        lines = []
        if self.export and self.differences:
            lines.append(
                f"kvpress's presses differ from the scored patterns in {self.differences} way"
                f"{'s' if self.differences != 1 else ''}; the exported module lists them"
            )
        if not self.export:
            if self.refusal:
                lines.append(f"kvpress cannot express it exactly: {self.refusal}")
            if self.approximate:
                lines.append("approximately: the export command above prints every change it makes")
        lines.append("with polykv-search's own runtime (what was scored):")
        if markdown:
            return [f"- {line}" for line in lines] + ["", "```python", *self.runtime.splitlines(), "```"]
        return lines + ["    " + line for line in self.runtime.splitlines()]

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "command": self.command}


def deployment(row: Row, model: str | None) -> Deployment:
    """How to deploy ``row`` (a strategy or baseline of a comparison), for the ``model`` it was scored on."""
    file, make = _strategy_file(row)
    module = module_name(row) + ".py"
    runtime = runtime_snippet(file or "strategy.json", model)
    try:
        strategy = Strategy.from_json(row.strategy)
    except Exception as err:  # noqa: BLE001 - a results file without (or with a broken) strategy: say why
        return Deployment(file, make, None, None, 0, f"its strategy is not in the results ({err})", runtime)
    export = approximate = refusal = None
    differences = 0
    source = shlex.quote(file) if file else "STRATEGY.json"
    try:
        done = render_export(strategy, "kvpress", module, ExportOptions())
        export = f"polykv-search export {source} --format kvpress --out {module}"
        differences = sum(note.startswith(DIFFERS) for note in done.notes)
    except ExportError as err:
        refusal = str(err)
        try:
            render_export(strategy, "kvpress", module, ExportOptions(approximate=True))
            approximate = f"polykv-search export {source} --format kvpress --approximate --out {module}"
        except ExportError:
            pass
    return Deployment(file, make, export, approximate, differences, refusal, runtime)


def module_name(row: Row) -> str:
    """A Python module name for ``row``'s kvpress export (``uniform-kvzip[allocation=model]`` ->
    ``uniform_kvzip_allocation_model_press``)."""
    stem = re.sub(r"\W+", "_", row.name).strip("_") or "strategy"
    return f"{'s_' if stem[0].isdigit() else ''}{stem}_press"


def runtime_snippet(strategy_file: str, model: str | None) -> str:
    """Python that loads the model and generates with the strategy applied (polykv_search.runtime)."""
    return "\n".join(
        [
            "from polykv_search.models import load_model",
            "from polykv_search.runtime import apply_strategy",
            "from strategies import Strategy",
            f"model, tok = load_model({model or 'smollm2-135m'!r})",
            'prompt = "..."  # your context, then your question',
            f"with apply_strategy(model, Strategy.load({strategy_file!r})):",
            "    out = model.generate(**tok(prompt, return_tensors='pt'), max_new_tokens=64)",
        ]
    )


def _strategy_file(row: Row) -> tuple[str | None, str | None]:
    """``(file, command that writes it)``: the scored file, or for a spec baseline the ``solve`` that rebuilds it."""
    source = row.source or ""
    if source.endswith(".json"):
        return source, None
    provenance = (row.strategy or {}).get("provenance") or {}
    solver = provenance.get("solver") or row.solver
    layers = layers_of(row.strategy)
    if solver not in SPEC_SOLVERS or not layers or row.budget is None:
        return None, None
    file = f"{module_name(row).removesuffix('_press')}.json"
    pattern = (provenance.get("settings") or {}).get("pattern")
    argv = ["polykv-search", "solve", "--method", solver]
    argv += ["--pattern", pattern] if pattern else []
    argv += ["--budget", fmt_budget(row.budget)]
    if row.strategy.get("b_min") is not None:
        argv += ["--b-min", str(row.strategy["b_min"])]
    argv += ["--num-layers", str(len(layers)), "--out", file]
    return file, shlex.join(argv)


def wrap_command(command: str, width: int = WIDTH) -> list[str]:
    """``command`` as shell lines of at most ``width`` columns where its words allow: an option stays with its
    value, every line but the last ends in `` \\``, the continuations are indented by 4. Joined back by the
    shell, the lines are the same words (a word longer than a line gets a line of its own)."""
    words = shlex.split(command)
    parts: list[str] = []
    for word in map(shlex.quote, words):
        if parts and parts[-1].startswith("--") and " " not in parts[-1] and not word.startswith("-"):
            parts[-1] += f" {word}"  # --out x.json: one part
        else:
            parts.append(word)
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + 1 + len(part) + 2 <= width:
            lines[-1] += f" {part}"
        else:
            lines.append(f"    {part}")
    return [f"{line} \\" for line in lines[:-1]] + [lines[-1]]
