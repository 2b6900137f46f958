"""Task shards: results files that split one suite's tasks between them.

A long suite can be scored one task per run (``score --suite ruler/cwe``, ``--suite ruler/vt``, ...,
e.g. on several machines, or a few tasks per session). Files whose task sets of a suite are
*disjoint* are shards of one run: :func:`compare` merges them, and a row's suite score is then the
unweighted mean of its task scores over every task of the suite (the rule of one file), its KV bytes
the sample-weighted mean. A row that lacks one of the suite's tasks gets no suite score.

Task sets may also overlap without being equal (a file of the whole suite beside per-task files of
further entries on the same draw) when every shared task carries the same samples fingerprint in both
files: the samples are then the same, and the files merge as above. Without fingerprints (older
files), overlapping unequal sets are taken for different samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polykv_search.compare.model import Row, num


class SuiteTasks:
    """The task sets each suite has been seen with, and the first file of each."""

    def __init__(self) -> None:
        self.sets: dict[str, dict[frozenset[str], str]] = {}

    def add(self, suite: str, tasks: frozenset[str], src: str, fingerprints: Mapping[str, Any]) -> str | None:
        """Record ``src``'s tasks of ``suite`` (``fingerprints``: task -> samples fingerprint, None when
        the file has none); a problem message when they overlap another file's unequal set on a task
        without a fingerprint (None when equal to one, disjoint from all, or overlapping on fingerprinted
        tasks). Fingerprints that differ between files are the caller's per-task problem."""
        seen = self.sets.setdefault(suite, {})
        for other in seen:
            shared = tasks & other
            if other == tasks or all(fingerprints.get(t) is not None for t in shared):
                continue
            return (
                f"{seen[other]} and {src} were scored on different samples "
                f"(suite {suite} has tasks {sorted(other)} vs {sorted(tasks)})"
            )
        seen.setdefault(tasks, src)
        return None

    def sharded(self) -> dict[str, list[str]]:
        """Suite -> every task of it, for the suites split over several files."""
        return {s: sorted(set().union(*sets)) for s, sets in self.sets.items() if len(sets) > 1}


def entry_weight(e: dict[str, Any]) -> int:
    """Samples behind an entry's KV bytes (its per-sample records; 1 when it has none)."""
    n = sum(len((t or {}).get("per_sample") or []) for t in (e.get("tasks") or {}).values())
    return max(n, 1)


def add_kv(row: Row, e: dict[str, Any], weights: dict[int, int]) -> None:
    """Fold a further shard's KV bytes into ``row`` (sample-weighted mean)."""
    w_old, w_new = weights.get(id(row), 1), entry_weight(e)
    for name in ("kv_bytes", "full_kv_bytes"):
        old, new = getattr(row, name), num(e.get(name))
        if old is not None and new is not None:
            setattr(row, name, (old * w_old + new * w_new) / (w_old + w_new))
    if row.kv_bytes is not None and row.full_kv_bytes:
        row.kv_ratio = row.kv_bytes / row.full_kv_bytes
    weights[id(row)] = w_old + w_new


def suite_scores(rows: Sequence[Row], sharded: dict[str, list[str]], warnings: list[str]) -> None:
    """Recompute each row's score on every sharded suite from its task scores."""
    for suite, tasks in sharded.items():
        for row in rows:
            missing = [t for t in tasks if row.scores.get(t) is None]
            if missing:
                row.suites.pop(suite, None)
                warnings.append(f"{row.name} has no {', '.join(missing)}: no {suite} score (the suite is sharded)")
            else:
                row.suites[suite] = sum(row.scores[t] for t in tasks) / len(tasks)


def merge_settings(settings: dict[str, Any], more: dict[str, Any]) -> None:
    """Fold a further file's settings into a run's: a setting the files differ in (task shards' seeds
    and suites) becomes the list of its values, in file order."""
    for k, v in more.items():
        if k not in settings:
            settings[k] = v
            continue
        values = settings[k] if isinstance(settings[k], list) else [settings[k]]
        if v not in values:
            settings[k] = [*values, v]
