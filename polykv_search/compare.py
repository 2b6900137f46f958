"""Compare score results: one table of strategies and baselines, gap recovered, plots.

The library side of ``polykv-search compare``. It reads results files written by
``polykv-search score`` (schema ``polykv-results`` v1), checks that they were made on the same
samples, model and budget (or groups them by budget when told), merges their entries into one list
of rows (deduplicated by strategy digest + budget) and computes, per budget and suite, the
**gap recovered** (DESIGN.md §2)::

    gap = (S_strategy - S_bestuniform) / (S_full - S_bestuniform)

where ``S_bestuniform`` is the best uniform single-pattern baseline (solver ``uniform``) at that
budget on that suite and ``S_full`` the FullKV entry. The gap is ``None`` ("n/a") when FullKV or
every uniform baseline is missing, or when ``S_full <= S_bestuniform`` (no gap to recover).

Typical use::

    docs = [load_results(p) for p in paths]
    comparison = compare(docs, sources=paths)
    print(to_markdown(comparison))
    plot(comparison, "compare.png")
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from polykv_search.scoring import RESULTS_SCHEMA, RESULTS_VERSION

COMPARISON_SCHEMA = "polykv-comparison"
COMPARISON_VERSION = 1
MIB = 2**20

#: settings that change scores without changing the samples: differences are reported as warnings
RUNTIME_SETTINGS = ("decode_interval", "max_new_tokens", "dtype", "attn", "device")


class CompareError(ValueError):
    """Results that cannot be compared (unreadable, wrong schema, mismatched runs)."""


# ================================================================================== reading
def load_results(path: str | Path) -> dict[str, Any]:
    """Read and check one results file; raises :class:`CompareError` with a one-line reason."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise CompareError(f"cannot read {path}: {err.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise CompareError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    check_results(doc, str(path))
    return doc


def check_results(doc: Any, where: str = "results") -> None:
    if not isinstance(doc, dict):
        raise CompareError(f"{where}: the top level must be a JSON object")
    if doc.get("schema") != RESULTS_SCHEMA:
        raise CompareError(f"{where}: schema is {doc.get('schema')!r}, expected {RESULTS_SCHEMA!r} (a `polykv-search score` results file)")
    if doc.get("version") != RESULTS_VERSION:
        raise CompareError(f"{where}: unsupported results version {doc.get('version')!r} (expected {RESULTS_VERSION})")
    prov = doc.get("provenance")
    if not isinstance(prov, dict) or not isinstance(prov.get("tasks", {}), dict):
        raise CompareError(f"{where}: provenance missing or malformed")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise CompareError(f"{where}: entries must be a list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise CompareError(f"{where}: entries[{i}] must be an object with a name")
        for key in ("scores", "suites"):
            if not isinstance(e.get(key, {}), dict):
                raise CompareError(f"{where}: entries[{i}].{key} must be an object")


# ==================================================================================== model
@dataclass
class Row:
    """One strategy or baseline at one budget, merged over the files it appears in."""

    name: str
    kind: str
    solver: str | None
    budget: float | None  # the entry's global budget; None for FullKV
    digest: str
    run: int
    family: str = ""
    scores: dict[str, float] = field(default_factory=dict)
    suites: dict[str, float] = field(default_factory=dict)
    kv_bytes: float | None = None
    full_kv_bytes: float | None = None
    kv_ratio: float | None = None
    gap: dict[str, float | None] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    strategy: dict[str, Any] | None = None

    @property
    def is_full(self) -> bool:
        return self.solver == "full" or (self.budget is None and self.solver is None)

    @property
    def is_uniform(self) -> bool:
        return self.solver == "uniform"

    @property
    def kv_mib(self) -> float | None:
        return None if self.kv_bytes is None else self.kv_bytes / MIB

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "kind": self.kind,
            "solver": self.solver,
            "family": self.family,
            "budget": self.budget,
            "run": self.run,
            "strategy_digest": self.digest,
            "scores": dict(self.scores),
            "suites": dict(self.suites),
            "kv_bytes": self.kv_bytes,
            "kv_mib": self.kv_mib,
            "full_kv_bytes": self.full_kv_bytes,
            "kv_ratio": self.kv_ratio,
            "gap_recovered": dict(self.gap),
            "sources": list(self.sources),
        }


@dataclass
class Reference:
    """What gap recovered is measured against, for one run, budget and suite."""

    run: int
    budget: float
    suite: str
    full: str | None
    s_full: float | None
    best_uniform: str | None
    s_best_uniform: float | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Comparison:
    """The merged rows plus everything needed to render, plot or save them."""

    rows: list[Row]
    suites: list[str]
    tasks: list[str]
    budgets: list[float]
    runs: list[dict[str, Any]]
    references: list[Reference]
    sources: list[str]
    warnings: list[str] = field(default_factory=list)

    @property
    def multi_budget(self) -> bool:
        return len(self.budgets) > 1

    @property
    def multi_run(self) -> bool:
        return len(self.runs) > 1

    def reference(self, run: int, budget: float | None, suite: str) -> Reference | None:
        for ref in self.references:
            if ref.run == run and ref.budget == budget and ref.suite == suite:
                return ref
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": COMPARISON_SCHEMA,
            "version": COMPARISON_VERSION,
            "definition": "gap_recovered = (S_strategy - S_bestuniform) / (S_full - S_bestuniform) per run, budget and suite; "
            "null when FullKV or every uniform baseline is missing or S_full <= S_bestuniform",
            "sources": list(self.sources),
            "suites": list(self.suites),
            "tasks": list(self.tasks),
            "budgets": list(self.budgets),
            "runs": list(self.runs),
            "references": [r.to_json() for r in self.references],
            "warnings": list(self.warnings),
            "rows": [r.to_json() for r in self.rows],
        }


# ================================================================================ comparing
def gap_recovered(s_strategy: float | None, s_best_uniform: float | None, s_full: float | None) -> float | None:
    """(S_strategy − S_bestuniform) / (S_full − S_bestuniform); None when undefined: a missing score,
    or no gap to recover (the best uniform baseline ties with or beats FullKV, where the ratio's sign
    would flip)."""
    if s_strategy is None or s_best_uniform is None or s_full is None:
        return None
    if not all(math.isfinite(x) for x in (s_strategy, s_best_uniform, s_full)):
        return None
    if s_full <= s_best_uniform:
        return None
    return (s_strategy - s_best_uniform) / (s_full - s_best_uniform)


def best_uniform(rows: Sequence[Row], suite: str) -> Row | None:
    """The uniform baseline with the highest score on ``suite`` (first one on ties)."""
    best: Row | None = None
    for row in rows:
        s = row.suites.get(suite)
        if row.is_uniform and _finite(s) and (best is None or s > best.suites[suite]):
            best = row
    return best


def compare(
    docs: Sequence[dict[str, Any]],
    *,
    sources: Sequence[str] | None = None,
    allow_mismatch: bool = False,
    across_budgets: bool = False,
) -> Comparison:
    """Merge results documents into one :class:`Comparison`.

    Raises :class:`CompareError` when the documents were made on different samples or models
    (unless ``allow_mismatch``) or at different budgets (unless ``across_budgets``).
    """
    if not docs:
        raise CompareError("no results to compare")
    sources = [str(s) for s in sources] if sources is not None else [f"results[{i}]" for i in range(len(docs))]
    if len(sources) != len(docs):
        raise CompareError("sources: one name per results document")
    for doc, src in zip(docs, sources):
        check_results(doc, src)
    warnings: list[str] = []
    mismatched = _check_models(docs, sources, allow_mismatch, warnings)
    mismatched = _check_samples(docs, sources, allow_mismatch, warnings) or mismatched
    budgets = _check_budgets(docs, sources, across_budgets)
    _check_runtime_settings(docs, sources, warnings)

    # runs: one unless mismatches were allowed; then one per distinct (model, samples)
    run_keys: list[str] = []
    runs: list[dict[str, Any]] = []
    doc_run: list[int] = []
    for doc, src in zip(docs, sources):
        prov = doc["provenance"]
        key = json.dumps([prov.get("model_fingerprint"), _task_fps(doc)], sort_keys=True) if mismatched else ""
        if key not in run_keys:
            run_keys.append(key)
            runs.append({"label": Path(src).stem if mismatched else "", "model": prov.get("model"),
                         "model_fingerprint": prov.get("model_fingerprint"), "sources": [],
                         "settings": _public_settings(prov.get("settings") or {}),
                         "tasks": {t: (v or {}).get("samples") for t, v in (prov.get("tasks") or {}).items()}})
        run = run_keys.index(key)
        runs[run]["sources"].append(src)
        doc_run.append(run)

    rows = _merge_rows(docs, sources, doc_run, warnings)
    suites = _ordered(s for doc in docs for e in doc["entries"] for s in (e.get("suites") or {}))
    tasks = _ordered(t for doc in docs for e in doc["entries"] for t in (e.get("scores") or {}))
    _disambiguate_names(rows)
    _assign_families(rows)
    rows = _sort_rows(rows)
    references = _compute_gaps(rows, suites, runs)
    return Comparison(rows, suites, tasks, budgets, runs, references, list(sources), warnings)


def _check_models(docs, sources, allow, warnings) -> bool:
    first = docs[0]["provenance"].get("model_fingerprint")
    for doc, src in zip(docs[1:], sources[1:]):
        fp = doc["provenance"].get("model_fingerprint")
        if fp != first:
            msg = (f"{sources[0]} and {src} were made with different models "
                   f"({docs[0]['provenance'].get('model')} {first} vs {doc['provenance'].get('model')} {fp})")
            if not allow:
                raise CompareError(f"{msg}; pass --allow-mismatch to compare anyway")
            warnings.append(f"{msg}; compared anyway (--allow-mismatch)")
            return True
    return False


def _check_samples(docs, sources, allow, warnings) -> bool:
    mismatched = False
    seen: dict[str, tuple[str, str]] = {}  # task -> (fingerprint, source)
    suite_tasks: dict[str, tuple[frozenset, str]] = {}
    for doc, src in zip(docs, sources):
        tasks = doc["provenance"].get("tasks") or {}
        problems = []
        for task, info in tasks.items():
            fp = (info or {}).get("samples")
            if task in seen and seen[task][0] != fp:
                problems.append(f"{seen[task][1]} and {src} were scored on different samples (task {task})")
            seen.setdefault(task, (fp, src))
        by_suite: dict[str, set] = {}
        for task, info in tasks.items():
            by_suite.setdefault((info or {}).get("suite") or task.split("/")[0], set()).add(task)
        for suite, names in by_suite.items():
            names_f = frozenset(names)
            if suite in suite_tasks and suite_tasks[suite][0] != names_f:
                problems.append(
                    f"{suite_tasks[suite][1]} and {src} were scored on different samples "
                    f"(suite {suite} has tasks {sorted(suite_tasks[suite][0])} vs {sorted(names_f)})"
                )
            suite_tasks.setdefault(suite, (names_f, src))
        if problems:
            if not allow:
                raise CompareError(f"{problems[0]}; pass --allow-mismatch to compare anyway")
            warnings.extend(f"{p}; compared anyway (--allow-mismatch)" for p in problems)
            mismatched = True
    return mismatched


def _check_budgets(docs, sources, across) -> list[float]:
    found: dict[float, str] = {}
    for doc, src in zip(docs, sources):
        settings = doc["provenance"].get("settings") or {}
        values = [settings.get("budget")] + [e.get("global_budget") for e in doc["entries"] if not _entry_is_full(e)]
        for b in values:
            if b is None:
                continue
            try:
                b = float(b)
            except (TypeError, ValueError):
                raise CompareError(f"{src}: budget {b!r} is not a number") from None
            found.setdefault(b, src)
    budgets = sorted(found)
    if len(budgets) > 1 and not across:
        shown = ", ".join(f"{b:g} ({found[b]})" for b in budgets)
        raise CompareError(f"results are at different budgets: B = {shown}; pass --across-budgets to group rows by budget")
    return budgets


def _check_runtime_settings(docs, sources, warnings) -> None:
    base = docs[0]["provenance"].get("settings") or {}
    for doc, src in zip(docs[1:], sources[1:]):
        s = doc["provenance"].get("settings") or {}
        diff = [k for k in RUNTIME_SETTINGS if k in base and k in s and base[k] != s[k]]
        if diff:
            shown = ", ".join(f"{k} {base[k]!r} vs {s[k]!r}" for k in diff)
            warnings.append(f"{sources[0]} and {src} differ in runtime settings ({shown}); scores may not be comparable")


def _entry_is_full(e: dict[str, Any]) -> bool:
    if e.get("solver") == "full":
        return True
    strategy = e.get("strategy")
    if isinstance(strategy, dict) and strategy.get("layers"):
        try:
            return all(l[p]["budget"] is None for l in strategy["layers"] for p in ("prefill", "decoding"))
        except (KeyError, TypeError):
            return False
    return e.get("global_budget") is None and e.get("solver") is None


def _merge_rows(docs, sources, doc_run, warnings) -> list[Row]:
    rows: dict[tuple, Row] = {}
    for doc, src, run in zip(docs, sources, doc_run):
        for e in doc["entries"]:
            full = _entry_is_full(e)
            budget = None if full or e.get("global_budget") is None else float(e["global_budget"])
            digest = e.get("strategy_digest") or _digest_of(e)
            key = (digest, budget, run)
            row = rows.get(key)
            if row is None:
                row = rows[key] = Row(
                    name=e["name"], kind=e.get("kind") or "strategy", solver="full" if full else e.get("solver"),
                    budget=budget, digest=digest, run=run,
                    kv_bytes=_num(e.get("kv_bytes")), full_kv_bytes=_num(e.get("full_kv_bytes")),
                    kv_ratio=_num(e.get("kv_ratio")) if not full else (_num(e.get("kv_ratio")) or 1.0),
                    strategy=e.get("strategy") if isinstance(e.get("strategy"), dict) else None,
                )
            else:
                if e["name"] != row.name and e["name"] not in row.aliases:
                    # a baseline names the row better than a strategy file that happens to equal it
                    if e.get("kind") == "baseline" and row.kind != "baseline":
                        row.aliases.append(row.name)
                        row.name, row.kind, row.solver = e["name"], "baseline", e.get("solver") or row.solver
                    else:
                        row.aliases.append(e["name"])
                if e.get("solver") == "uniform":
                    row.solver = "uniform"
            if src not in row.sources:
                row.sources.append(src)
            conflicts = []
            for key_, target in (("scores", row.scores), ("suites", row.suites)):
                for k, v in (e.get(key_) or {}).items():
                    v = _num(v)
                    if k in target and target[k] != v and not (target[k] is None or v is None):
                        conflicts.append(k)
                    target.setdefault(k, v)
            if conflicts:
                warnings.append(
                    f"{row.name} (B={_fmt_budget(budget)}) has different scores in {row.sources[0]} and {src} "
                    f"on {', '.join(sorted(set(conflicts)))}; keeping {row.sources[0]}"
                )
    return list(rows.values())


def _assign_families(rows: list[Row]) -> None:
    """Label rows that are the same method at different budgets (for the score-vs-budget plot)."""
    keys: dict[str, dict[str, str]] = {}  # label -> {family key -> first entry name}
    for row in rows:
        prov = (row.strategy or {}).get("provenance") or {}
        pattern = _single_pattern(row.strategy) or (prov.get("settings") or {}).get("pattern") or prov.get("pattern")
        suffix = f"-B{_fmt_budget(row.budget)}" if row.budget is not None else None
        if row.is_full:
            label, key = "full", "full"
        elif row.solver == "uniform" and pattern:
            label = key = f"uniform-{pattern}"  # the names `score` gives its baselines
        elif row.solver == "pyramid" and pattern:
            label = key = "pyramid" if pattern == "pyramidkv" else f"pyramid-{pattern}"
        elif suffix and row.name.endswith(suffix) and len(row.name) > len(suffix):
            label = key = row.name[: -len(suffix)]  # files named NAME-B{budget} (quickstart, reproduce.py)
        elif row.solver:
            label = row.solver
            key = json.dumps([row.solver, prov.get("settings"), prov.get("phases_optimized"), prov.get("default_pattern"),
                              prov.get("ablation")], sort_keys=True, default=str)
        else:
            label = key = row.name
        keys.setdefault(label, {}).setdefault(key, row.name)
        variants = keys[label]
        row.family = label if len(variants) == 1 or list(variants).index(key) == 0 else f"{label} ({variants[key]})"
    taken: set[tuple] = set()
    for row in rows:  # one row per (family, run, budget): a second one gets its own family
        if (row.family, row.run, row.budget) in taken:
            row.family = f"{row.family} ({row.name})"
        taken.add((row.family, row.run, row.budget))


def _sort_rows(rows: list[Row]) -> list[Row]:
    def rank(r: Row) -> tuple:
        kind = 0 if r.is_full else 1 if r.is_uniform else 2 if r.kind == "baseline" else 3
        return (r.run, -1 if r.budget is None else 0, r.budget or 0.0, kind)

    return sorted(rows, key=rank)  # stable: file order within each kind


def _compute_gaps(rows: list[Row], suites: list[str], runs: list[dict]) -> list[Reference]:
    refs: list[Reference] = []
    for run in range(len(runs)):
        full = next((r for r in rows if r.run == run and r.is_full), None)
        budgets = _ordered(r.budget for r in rows if r.run == run and r.budget is not None)
        for budget in budgets:
            group = [r for r in rows if r.run == run and r.budget == budget]
            for suite in suites:
                bu = best_uniform(group, suite)
                s_full = full.suites.get(suite) if full else None
                s_bu = bu.suites[suite] if bu else None
                refs.append(Reference(run, budget, suite, full.name if full else None, s_full,
                                      bu.name if bu else None, s_bu))
                for r in group:
                    r.gap[suite] = gap_recovered(r.suites.get(suite), s_bu, s_full)
    return refs


def _disambiguate_names(rows: list[Row]) -> None:
    seen: dict[tuple, list[Row]] = {}
    for r in rows:
        seen.setdefault((r.name, r.budget, r.run), []).append(r)
    for same in seen.values():
        if len(same) > 1:
            for r in same:
                r.name = f"{r.name} [{r.digest[:6]}]"


# ================================================================================ rendering
@dataclass
class Column:
    key: str
    header: str
    better: str  # "high", "low" or ""


def columns(c: Comparison, tasks: bool = False) -> list[Column]:
    cols = [Column("name", "entry", "")]
    if c.multi_run:
        cols.append(Column("run", "run", ""))
    cols.append(Column("budget", "B", ""))
    if tasks:
        cols += [Column(f"task:{t}", t, "high") for t in c.tasks]
    cols += [Column(f"suite:{s}", s, "high") for s in c.suites]
    cols += [Column("kv_mib", "KV MiB", "low"), Column("kv_ratio", "KV % FullKV", "low")]
    cols += [Column(f"gap:{s}", f"gap {s}", "high") for s in c.suites]
    return cols


def _value(c: Comparison, row: Row, col: Column) -> Any:
    kind, _, arg = col.key.partition(":")
    if kind == "task":
        return row.scores.get(arg)
    if kind == "suite":
        return row.suites.get(arg)
    if kind == "gap":
        return row.gap.get(arg)
    if kind == "run":
        return c.runs[row.run]["label"]
    return getattr(row, col.key)


def _text(c: Comparison, row: Row, col: Column) -> str:
    v = _value(c, row, col)
    kind = col.key.partition(":")[0]
    if kind == "name" or kind == "run":
        return str(v)
    if kind == "budget":
        return _fmt_budget(v)
    if kind == "gap":
        if row.is_full:
            return "ref"
        return "n/a" if v is None else f"{100 * v:.1f}%"
    if v is None or not _finite(v):
        return "-"
    if kind == "kv_mib":
        return f"{v:.2f}"
    if kind == "kv_ratio":
        return f"{100 * v:.1f}%"
    return f"{v:.1f}"


def best_cells(c: Comparison, cols: Sequence[Column]) -> set[tuple[int, str]]:
    """(row index, column key) of the best value per column within each budget group.

    FullKV is the reference and is never highlighted; ties (equal as displayed) all count, and a
    column where every row of a group shows the same value highlights nothing in that group.
    """
    best: set[tuple[int, str]] = set()
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(c.rows):
        if not r.is_full:
            groups.setdefault((r.run, r.budget), []).append(i)
    for members in groups.values():
        for col in cols:
            if not col.better:
                continue
            shown = [(i, _text(c, c.rows[i], col)) for i in members]
            vals = [(i, float(t.rstrip("%"))) for i, t in shown if _is_number(t.rstrip("%"))]
            if not vals:
                continue
            if len({v for _, v in vals}) < 2:
                continue  # nothing to single out when every row shows the same value
            target = (max if col.better == "high" else min)(v for _, v in vals)
            best.update((i, col.key) for i, v in vals if v == target)
    return best


def to_markdown(c: Comparison, tasks: bool = False) -> str:
    """A GitHub markdown table; best values per column (per budget group) in **bold**."""
    cols = columns(c, tasks)
    best = best_cells(c, cols)
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(col.header) for col in cols) + " |"]
    lines.append("|" + "|".join("---" if col.key in ("name", "run") else "---:" for col in cols) + "|")
    for i, row in enumerate(c.rows):
        cells = []
        for col in cols:
            t = esc(_text(c, row, col))
            cells.append(f"**{t}**" if (i, col.key) in best else t)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_rich(c: Comparison, tasks: bool = False, title: str | None = None):
    """A rich Table; best values per column (per budget group) in bold green."""
    from rich.table import Table

    cols = columns(c, tasks)
    best = best_cells(c, cols)
    table = Table(title=title if title is not None else describe(c))
    for col in cols:
        header = col.header.split("/")[-1] if col.key.startswith("task:") else col.header
        header = RICH_HEADERS.get(col.key.partition(":")[0], "{}").format(header.replace("gap ", "", 1))
        # cells are never cut: each column is at least as wide as its widest cell
        width = max([len(_text(c, r, col)) for r in c.rows] + [len(w) for w in header.split("\n")])
        table.add_column(header, justify="left" if col.key in ("name", "run") else "right", no_wrap=True, min_width=width)
    previous = None
    for i, row in enumerate(c.rows):
        group = (row.run, row.budget)
        if previous is not None and group != previous and (c.multi_budget or c.multi_run) and row.budget is not None:
            table.add_section()
        previous = group
        cells = []
        for col in cols:
            t = _text(c, row, col).replace("[", r"\[")
            cells.append(f"[bold green]{t}[/bold green]" if (i, col.key) in best else t)
        table.add_row(*cells, style="dim" if row.is_full else None)
    return table


RICH_HEADERS = {"kv_mib": "KV\nMiB", "kv_ratio": "KV %\nFullKV", "gap": "gap\n{}"}


def describe(c: Comparison) -> str:
    """One line about what was compared (model, context, samples, budgets)."""
    run = c.runs[0]
    s = run["settings"]
    bits = [str(run.get("model") or "?")]
    if s.get("context_len"):
        bits.append(f"context {s['context_len']}")
    if s.get("samples"):
        bits.append(f"{s['samples']} sample{'s' if s['samples'] != 1 else ''} per task")
    if s.get("seed") is not None:
        bits.append(f"seed {s['seed']}")
    if c.budgets:
        bits.append("B = " + ", ".join(f"{b:g}" for b in c.budgets))
    if c.multi_run:
        bits.append(f"{len(c.runs)} mismatched runs")
    return "compare — " + ", ".join(bits)


# ==================================================================================== plots
def plot(c: Comparison, path: str | Path, *, dpi: int = 110) -> Path:
    """PNG: (a) per-layer budgets and patterns of every non-uniform strategy, (b) score vs budget.

    (a) is drawn when some row is neither FullKV nor uniform; (b) when several budgets are
    compared. With neither, a bar chart of suite scores per entry is drawn instead.
    """
    import io

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from polykv_search.io import atomic_write_bytes

    layered = [r for r in c.rows if not r.is_full and not r.is_uniform and _layers(r.strategy)]
    sweep = c.multi_budget
    parts = []
    if layered:
        parts.append("layers")
    if sweep:
        parts.append("sweep")
    if not parts:
        parts.append("bars")

    # panel grid for (a): rows = families, columns = budgets (one row when one budget)
    if layered:
        fams = _ordered(r.family for r in layered)
        bud = _ordered(sorted({r.budget for r in layered}))
        by_budget = len(bud) > 1
        if by_budget:
            grid = {(fams.index(r.family), bud.index(r.budget)): r for r in layered}
            a_rows, a_cols = len(fams), len(bud)
        else:
            a_cols = min(len(layered), 3)
            a_rows = math.ceil(len(layered) / a_cols)
            grid = {(i // a_cols, i % a_cols): r for i, r in enumerate(layered)}
        n_layers = max(len(_layers(r.strategy)) for r in layered)
        panel_w = max(4.5, min(9.0, 0.22 * n_layers + 1.5))
    heights = {"layers": 3.2 * a_rows if layered else 0, "sweep": 3.6, "bars": 3.8}
    width = max(9.0, panel_w * a_cols if layered else 0, 4.5 * max(1, len(c.suites)))
    fig = plt.figure(figsize=(width, sum(heights[p] for p in parts) + 0.6 * len(parts)), layout="constrained")
    subfigs = fig.subfigures(len(parts), 1, height_ratios=[heights[p] for p in parts])
    subfigs = list(subfigs) if len(parts) > 1 else [subfigs]  # each part titles its own subfigure
    fig.suptitle(describe(c), fontsize=11)
    for part, sub in zip(parts, subfigs):
        if part == "layers":
            _plot_layers(sub, c, grid, a_rows, a_cols, Patch, by_budget)
        elif part == "sweep":
            _plot_sweep(sub, c)
        else:
            _plot_bars(sub, c)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def pattern_colors() -> dict[str, Any]:
    import matplotlib

    from polykv_search.patterns import PATTERNS

    cmap = matplotlib.colormaps["tab10"]
    return {p: cmap(i % 10) for i, p in enumerate(PATTERNS)}


def _plot_layers(sub, c: Comparison, grid, n_rows: int, n_cols: int, Patch, by_budget: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    colors = pattern_colors()
    extra = iter(["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"])
    # one budget: every panel on the same scale; a budgets grid: same scale down each budget column
    axes = sub.subplots(n_rows, n_cols, squeeze=False, sharey="col" if by_budget else True)
    used: list[str] = []
    for (i, j), ax in [((i, j), axes[i][j]) for i in range(n_rows) for j in range(n_cols)]:
        row = grid.get((i, j))
        if row is None:
            ax.set_visible(False)
            continue
        layers = _layers(row.strategy)
        x = list(range(len(layers)))
        for offset, phase, hatch in ((-0.21, "prefill", None), (0.21, "decoding", "////")):
            pats = [l[phase]["pattern"] for l in layers]
            budgets = [l[phase]["budget"] or 0 for l in layers]
            for p in pats:
                if p not in colors:
                    colors[p] = next(extra, "#333333")
                if p not in used:
                    used.append(p)
            cols = [colors[p] for p in pats]
            if hatch:  # decoding: pale fill, hatched in the pattern's color
                ax.bar([k + offset for k in x], budgets, width=0.4, color=[_pale(c_) for c_ in cols],
                       hatch=hatch, edgecolor=cols, linewidth=0.0)
            else:
                ax.bar([k + offset for k in x], budgets, width=0.4, color=cols, linewidth=0.0)
        if row.budget is not None:
            ax.axhline(row.budget, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{row.name}  (B={_fmt_budget(row.budget)})", fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        if j == 0:
            ax.set_ylabel("tokens kept / KV head", fontsize=8)
        ax.tick_params(labelsize=7, labelleft=True)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(-0.7, len(layers) - 0.3)
        ax.margins(y=0.05)
    handles = [Patch(facecolor=colors[p], label=p) for p in used]
    handles += [Patch(facecolor="dimgray", label="prefill (left bar)"),
                Patch(facecolor=_pale("dimgray"), hatch="////", edgecolor="dimgray", linewidth=0.0, label="decoding (right bar, hatched)")]
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8, label="global budget B"))
    sub.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=8, frameon=False)
    sub.suptitle("(a) per-layer budgets and patterns", fontsize=10, x=0.01, ha="left")


def _plot_sweep(sub, c: Comparison) -> None:
    suites = c.suites or ["(none)"]
    axes = sub.subplots(1, len(suites), squeeze=False)[0]
    markers = "osD^v<>Ph*X"
    for ax, suite in zip(axes, suites):
        families = _ordered(r.family for r in c.rows if not r.is_full)
        for k, fam in enumerate(families):
            for run in range(len(c.runs)):
                pts = sorted((r.budget, r.suites.get(suite)) for r in c.rows
                             if r.family == fam and r.run == run and r.budget is not None and _finite(r.suites.get(suite)))
                if not pts:
                    continue
                label = fam if not c.multi_run else f"{fam} [{c.runs[run]['label']}]"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[k % len(markers)],
                        linestyle="-" if "uniform" not in fam else "--", label=label, linewidth=1.3, markersize=5)
        for r in c.rows:
            if r.is_full and _finite(r.suites.get(suite)):
                label = "FullKV" if not c.multi_run else f"FullKV [{c.runs[r.run]['label']}]"
                ax.axhline(r.suites[suite], color="black", linestyle=":", linewidth=1.2, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(c.budgets, [f"{b:g}" for b in c.budgets])
        ax.minorticks_off()
        ax.set_xlabel("global budget B (tokens / layer)", fontsize=8)
        ax.set_ylabel(f"{suite} score", fontsize=8)
        ax.set_title(suite, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    sub.legend(uniq.values(), uniq.keys(), loc="outside right center", fontsize=8, frameon=False)
    sub.suptitle("(b) score vs budget", fontsize=10, x=0.01, ha="left")


def _plot_bars(sub, c: Comparison) -> None:
    suites = c.suites or []
    ax = sub.subplots()
    names = [r.name if not c.multi_budget else f"{r.name} B={_fmt_budget(r.budget)}" for r in c.rows]
    width = 0.8 / max(1, len(suites))
    for k, suite in enumerate(suites):
        vals = [r.suites.get(suite) if _finite(r.suites.get(suite)) else 0.0 for r in c.rows]
        ax.bar([i + (k - (len(suites) - 1) / 2) * width for i in range(len(c.rows))], vals, width=width, label=suite)
    ax.set_xticks(range(len(c.rows)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("score", fontsize=8)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    sub.suptitle("suite scores (no non-uniform strategy and a single budget: nothing per-layer to draw)", fontsize=10, x=0.01, ha="left")


# ================================================================================== helpers
def _pale(color: Any, amount: float = 0.6) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return tuple(c + (1.0 - c) * amount for c in to_rgb(color))  # type: ignore[return-value]


def _layers(strategy: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not isinstance(strategy, dict) or not isinstance(strategy.get("layers"), list):
        return []
    return strategy["layers"]


def _single_pattern(strategy: dict[str, Any] | None) -> str | None:
    pats = {l.get("prefill", {}).get("pattern") for l in _layers(strategy)}
    return pats.pop() if len(pats) == 1 else None


def _task_fps(doc: dict[str, Any]) -> dict[str, Any]:
    return {t: (v or {}).get("samples") for t, v in (doc["provenance"].get("tasks") or {}).items()}


def _public_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k in ("suite", "samples", "context_len", "seed", "corpus", "budget", *RUNTIME_SETTINGS)}


def _digest_of(e: dict[str, Any]) -> str:
    import hashlib

    body = dict(e.get("strategy") or {"name": e["name"]})
    body.pop("provenance", None)
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _finite(v: Any) -> bool:
    return _num(v) is not None


def _is_number(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


def _fmt_budget(b: float | None) -> str:
    return "-" if b is None else f"{b:g}"


def _ordered(items) -> list:
    seen: dict = {}
    for x in items:
        seen.setdefault(x, None)
    return list(seen)


__all__ = [
    "COMPARISON_SCHEMA", "COMPARISON_VERSION", "CompareError", "Comparison", "Reference", "Row",
    "best_uniform", "compare", "describe", "gap_recovered", "load_results", "plot", "to_markdown", "to_rich",
]
