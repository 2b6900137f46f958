"""Merging results documents into one :class:`~polykv_search.compare.model.Comparison`.

Checks that the documents were made on the same samples, model and budget (or groups them by
budget when told), merges their entries into rows (deduplicated by strategy digest + budget) and
hands the rows to :mod:`polykv_search.compare.gaps` for references, intervals and gap recovered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polykv_search import stats
from polykv_search.compare.gaps import compute_references
from polykv_search.compare.model import Comparison, Row, fmt_budget, layers_of, num, ordered
from polykv_search.compare.reading import CompareError, check_results, entry_samples
from polykv_search.compare.shards import SuiteTasks, add_kv, entry_weight, merge_settings, suite_scores
from polykv_search.protocol import protocol_of
from strategies import PHASES

#: settings that change scores without changing the samples: differences are reported as warnings
RUNTIME_SETTINGS = ("decode_interval", "interval_mode", "max_new_tokens", "dtype", "attn", "device")


def compare(
    docs: Sequence[dict[str, Any]],
    *,
    sources: Sequence[str] | None = None,
    allow_mismatch: bool = False,
    across_budgets: bool = False,
    level: float = stats.LEVEL,
    resamples: int = stats.RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Merge results documents into one :class:`Comparison`.

    Parameters
    ----------
    docs : sequence of dict
        Results documents (``polykv-results`` v1 or v2), e.g. from :func:`load_results`.
    sources : sequence of str, optional
        A name per document (its path), used in messages and the JSON.
    allow_mismatch : bool
        Compare documents made on different samples or models; each (model, samples) is a run
        with its own references. Documents that split a suite's tasks between them (disjointly, or
        overlapping on tasks of the same samples fingerprint) are not a mismatch but task shards of one
        run (:mod:`~polykv_search.compare.shards`).
    across_budgets : bool
        Allow several budgets; rows are grouped by budget.
    level, resamples, seed
        Bootstrap settings of every interval (:mod:`polykv_search.stats`).

    Raises
    ------
    CompareError
        When the documents were made on different samples or models (unless ``allow_mismatch``)
        or at different budgets (unless ``across_budgets``).
    """
    if not docs:
        raise CompareError("no results to compare")
    sources = [str(s) for s in sources] if sources is not None else [f"results[{i}]" for i in range(len(docs))]
    if len(sources) != len(docs):
        raise CompareError("sources: one name per results document")
    for doc, src in zip(docs, sources):
        check_results(doc, src)
    _check_protocols(docs, sources)
    warnings: list[str] = []
    mismatched = _check_models(docs, sources, allow_mismatch, warnings)
    suite_tasks = SuiteTasks()
    mismatched = _check_samples(docs, sources, allow_mismatch, warnings, suite_tasks) or mismatched
    sharded = {} if mismatched else suite_tasks.sharded()
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
            runs.append(
                {
                    "label": Path(src).stem if mismatched else "",
                    "model": prov.get("model"),
                    "model_fingerprint": prov.get("model_fingerprint"),
                    "sources": [],
                    "settings": _public_settings(prov.get("settings") or {}),
                    "engine": prov.get("engine"),
                    "protocol": protocol_of(prov),
                    "tasks": {t: (v or {}).get("samples") for t, v in (prov.get("tasks") or {}).items()},
                }
            )
        run = run_keys.index(key)
        if runs[run]["sources"]:
            merge_settings(runs[run]["settings"], _public_settings(prov.get("settings") or {}))
        runs[run]["sources"].append(src)
        doc_run.append(run)

    rows = _merge_rows(docs, sources, doc_run, warnings, sharded)
    suite_scores(rows, sharded, warnings)
    suites = ordered(s for doc in docs for e in doc["entries"] for s in (e.get("suites") or {}))
    tasks = ordered(t for doc in docs for e in doc["entries"] for t in (e.get("scores") or {}))
    suite_of = _suite_of_tasks(docs, tasks)
    _disambiguate_names(rows)
    _assign_families(rows)
    rows = _sort_rows(rows)
    options = {"level": level, "resamples": resamples, "seed": seed}
    references = compute_references(rows, suites, suite_of, len(runs), options, warnings)
    statistics = {
        "method": f"{stats.METHOD} bootstrap (percentile where BCa has no finite bound), scipy.stats.bootstrap",
        "level": level,
        "resamples": resamples,
        "seed": seed,
        "pairing": "every entry of a run is resampled on the same sample indices",
        "strata": "samples are resampled within each task; a suite score is the unweighted mean of its task scores",
        "task_suites": suite_of,
    }
    return Comparison(rows, suites, tasks, budgets, runs, references, list(sources), warnings, statistics)


def _suite_of_tasks(docs, tasks: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for doc in docs:
        for task, info in (doc["provenance"].get("tasks") or {}).items():
            out.setdefault(task, (info or {}).get("suite") or task.split("/")[0])
    return {t: out.get(t, t.split("/")[0]) for t in tasks}


def _check_protocols(docs, sources) -> None:
    """Files of different protocols are never paired, --allow-mismatch or not (docs/scoring.md)."""
    first = protocol_of(docs[0]["provenance"])
    for doc, src in zip(docs[1:], sources[1:]):
        other = protocol_of(doc["provenance"])
        if other != first:
            raise CompareError(
                f"{sources[0]} is {first} and {src} is {other}: results of different protocols are never "
                "paired; compare each protocol's files apart"
            )


def _check_models(docs, sources, allow, warnings) -> bool:
    first = docs[0]["provenance"].get("model_fingerprint")
    for doc, src in zip(docs[1:], sources[1:]):
        fp = doc["provenance"].get("model_fingerprint")
        if fp != first:
            msg = (
                f"{sources[0]} and {src} were made with different models "
                f"({docs[0]['provenance'].get('model')} {first} vs {doc['provenance'].get('model')} {fp})"
            )
            if not allow:
                raise CompareError(f"{msg}; pass --allow-mismatch to compare anyway")
            warnings.append(f"{msg}; compared anyway (--allow-mismatch)")
            return True
    return False


def _check_samples(docs, sources, allow, warnings, suite_tasks: SuiteTasks) -> bool:
    mismatched = False
    seen: dict[str, tuple[str, str]] = {}  # task -> (fingerprint, source)
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
            problem = suite_tasks.add(suite, frozenset(names), src, _task_fps(doc))
            if problem:
                problems.append(problem)
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
        raise CompareError(
            f"results are at different budgets: B = {shown}; pass --across-budgets to group rows by budget"
        )
    return budgets


def _check_runtime_settings(docs, sources, warnings) -> None:
    base = docs[0]["provenance"].get("settings") or {}
    for doc, src in zip(docs[1:], sources[1:]):
        s = doc["provenance"].get("settings") or {}
        diff = [k for k in RUNTIME_SETTINGS if k in base and k in s and base[k] != s[k]]
        if diff:
            shown = ", ".join(f"{k} {base[k]!r} vs {s[k]!r}" for k in diff)
            warnings.append(
                f"{sources[0]} and {src} differ in runtime settings ({shown}); scores may not be comparable"
            )


def _entry_is_full(e: dict[str, Any]) -> bool:
    if e.get("solver") == "full":
        return True
    strategy = e.get("strategy")
    if isinstance(strategy, dict) and strategy.get("layers"):
        try:
            return all(l[p]["budget"] is None for l in strategy["layers"] for p in PHASES)
        except (KeyError, TypeError):
            return False
    return e.get("global_budget") is None and e.get("solver") is None


def _merge_rows(docs, sources, doc_run, warnings, sharded: dict[str, list[str]]) -> list[Row]:
    rows: dict[tuple, Row] = {}
    weights: dict[int, int] = {}  # id(row) -> samples behind its KV bytes (task shards)
    for doc, src, run in zip(docs, sources, doc_run):
        for e in doc["entries"]:
            full = _entry_is_full(e)
            budget = None if full or e.get("global_budget") is None else float(e["global_budget"])
            digest = e.get("strategy_digest") or _digest_of(e)
            key = (digest, budget, run)
            row = rows.get(key)
            if row is None:
                row = rows[key] = Row(
                    name=e["name"],
                    kind=e.get("kind") or "strategy",
                    solver="full" if full else e.get("solver"),
                    budget=budget,
                    digest=digest,
                    run=run,
                    kv_bytes=num(e.get("kv_bytes")),
                    full_kv_bytes=num(e.get("full_kv_bytes")),
                    kv_ratio=num(e.get("kv_ratio")) if not full else (num(e.get("kv_ratio")) or 1.0),
                    strategy=e.get("strategy") if isinstance(e.get("strategy"), dict) else None,
                    source=e.get("source") if isinstance(e.get("source"), str) else None,
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
            samples = entry_samples(e, f"{src}: {e['name']}")
            if row.samples and samples and row.samples.keys().isdisjoint(samples):  # a further task shard
                add_kv(row, e, weights)
            else:
                weights.setdefault(id(row), entry_weight(e))
            for task, ts in samples.items():
                row.samples.setdefault(task, ts)
            _check_sample_means(e, samples, src, warnings)
            conflicts = []
            for key_, target in (("scores", row.scores), ("suites", row.suites)):
                for k, v in (e.get(key_) or {}).items():
                    if key_ == "suites" and k in sharded:
                        continue  # a shard's partial mean: recomputed from the task scores
                    v = num(v)
                    if k in target and target[k] != v and not (target[k] is None or v is None):
                        conflicts.append(k)
                    target.setdefault(k, v)
            if conflicts:
                warnings.append(
                    f"{row.name} (B={fmt_budget(budget)}) has different scores in {row.sources[0]} and {src} "
                    f"on {', '.join(sorted(set(conflicts)))}; keeping {row.sources[0]}"
                )
    return list(rows.values())


def _assign_families(rows: list[Row]) -> None:
    """Label rows that are the same method at different budgets (for the score-vs-budget plot)."""
    keys: dict[str, dict[str, str]] = {}  # label -> {family key -> first entry name}
    for row in rows:
        prov = (row.strategy or {}).get("provenance") or {}
        pattern = _single_pattern(row.strategy) or (prov.get("settings") or {}).get("pattern") or prov.get("pattern")
        suffix = f"-B{fmt_budget(row.budget)}" if row.budget is not None else None
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
            key = json.dumps(
                [
                    row.solver,
                    prov.get("settings"),
                    prov.get("phases_optimized"),
                    prov.get("default_pattern"),
                    prov.get("ablation"),
                ],
                sort_keys=True,
                default=str,
            )
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


def _disambiguate_names(rows: list[Row]) -> None:
    seen: dict[tuple, list[Row]] = {}
    for r in rows:
        seen.setdefault((r.name, r.budget, r.run), []).append(r)
    for same in seen.values():
        if len(same) > 1:
            for r in same:
                r.name = f"{r.name} [{r.digest[:6]}]"


def _single_pattern(strategy: dict[str, Any] | None) -> str | None:
    pats = {l.get("prefill", {}).get("pattern") for l in layers_of(strategy)}
    return pats.pop() if len(pats) == 1 else None


def _task_fps(doc: dict[str, Any]) -> dict[str, Any]:
    return {t: (v or {}).get("samples") for t, v in (doc["provenance"].get("tasks") or {}).items()}


def _public_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in settings.items()
        if k in ("suite", "samples", "context_len", "seed", "corpus", "budget", *RUNTIME_SETTINGS)
    }


def _digest_of(e: dict[str, Any]) -> str:
    body = dict(e.get("strategy") or {"name": e["name"]})
    body.pop("provenance", None)
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _check_sample_means(e: dict[str, Any], samples: dict, src: str, warnings: list[str]) -> None:
    """Intervals are of per-sample means: say so when a file's task score is something else."""
    for task, ts in samples.items():
        stored = num((e.get("scores") or {}).get(task))
        mean = ts.mean()
        if stored is not None and mean is not None and abs(stored - mean) > 1e-6 * max(1.0, abs(stored)):
            warnings.append(
                f"{src}: {e['name']} scores {stored:.2f} on {task} but its per-sample scores average "
                f"{mean:.2f}; its interval is of the per-sample mean"
            )
