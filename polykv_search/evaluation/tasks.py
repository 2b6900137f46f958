"""The task registry: names, suites, and how to build a task.

>>> from polykv_search.evaluation import get_task, list_tasks
>>> [t["name"] for t in list_tasks("ruler")][:2]
['ruler/niah_single', 'ruler/niah_multikey']
>>> get_task("ruler/vt").max_new_tokens
30
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from polykv_search.evaluation.base import SUITES, Task
from polykv_search.evaluation.broad import BROAD_TASKS
from polykv_search.evaluation.decode import DECODE_TASKS, CarriedRecall
from polykv_search.evaluation.decode_spread import SpreadRecall
from polykv_search.evaluation.longbench import DATASETS as LONGBENCH_DATASETS
from polykv_search.evaluation.longbench import LongBenchTask
from polykv_search.evaluation.ruler import RULER_TASKS

_REGISTRY: dict[str, tuple[str, Callable[..., Task]]] = {}

#: Tasks a suite runs when it is asked for by name (``--suite longbench`` runs a handful).
SUITE_TASKS: dict[str, tuple[str, ...]] = {}

DEFAULT_LONGBENCH = (
    "narrativeqa",
    "qasper",
    "hotpotqa",
    "2wikimqa",
    "gov_report",
    "trec",
    "triviaqa",
    "passage_count",
    "lcc",
    "repobench-p",
)


def register(name: str, suite: str, factory: Callable[..., Task], *, default: bool = True) -> None:
    """Add a task; ``factory(**options)`` builds it. ``default`` puts it in its suite's run."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites: {', '.join(SUITES)}")
    if name in _REGISTRY:
        raise ValueError(f"task {name!r} is already registered")
    _REGISTRY[name] = (suite, factory)
    if default:
        SUITE_TASKS[suite] = SUITE_TASKS.get(suite, ()) + (name,)


for _cls in RULER_TASKS + BROAD_TASKS + DECODE_TASKS:
    register(_cls.name, _cls.suite, _cls)
# the recall variants run when named (``--suite decode,recall_spread,recall_carry``): the spread one wants a
# longer prompt than the suite's other tasks, and `--suite decode` keeps its tasks and suite score
for _cls in (SpreadRecall, CarriedRecall):
    register(_cls.name, _cls.suite, _cls, default=False)
for _d in LONGBENCH_DATASETS:
    register(f"longbench/{_d}", "longbench", partial(LongBenchTask, _d), default=_d in DEFAULT_LONGBENCH)


def task_names(suite: str | None = None) -> list[str]:
    return [n for n, (s, _) in _REGISTRY.items() if suite is None or s == suite]


def resolve_name(name: str) -> str:
    """Full registry name of ``name`` (``vt`` -> ``ruler/vt``); ``ValueError`` when unknown."""
    if name in _REGISTRY:
        return name
    matches = [n for n in _REGISTRY if n.split("/", 1)[1] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"task {name!r} is ambiguous: {', '.join(matches)}")
    raise ValueError(f"unknown task {name!r}; see `polykv-search score --list-tasks`")


def get_task(name: str, **options: Any) -> Task:
    """Build task ``name``; options go to its constructor.

    Options: ``source=`` and ``cache_dir=`` for ``longbench/*``; ``continuation_len=`` for
    ``broad/continuation``; ``generate_len=`` for ``decode/*``.
    """
    suite, factory = _REGISTRY[resolve_name(name)]
    try:
        return factory(**options)
    except TypeError as e:
        raise ValueError(f"bad options for task {name!r}: {e}") from None


def list_tasks(suite: str | None = None) -> list[dict[str, Any]]:
    """One info row per registered task (name, suite, description, metric, ...), registry order."""
    if suite is not None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites: {', '.join(SUITES)}")
    rows = []
    for name, (s, factory) in _REGISTRY.items():
        if suite is None or s == suite:
            rows.append({**factory().info(), "default": name in SUITE_TASKS.get(s, ())})
    return rows


def tasks_for(spec: str | list[str], **options: Any) -> list[Task]:
    """Tasks for a comma-separated mix of suite and task names (``"broad,ruler/vt"``), deduplicated.

    ``options`` maps a task name or suite to that task's constructor options, e.g.
    ``{"longbench": {"source": "data/"}}``.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        chosen = list(SUITE_TASKS.get(item, ())) if item in SUITES else [resolve_name(item)]
        names.extend(n for n in chosen if n not in names)
    if not names:
        raise ValueError("no tasks selected")
    tasks = []
    for n in names:
        suite = _REGISTRY[n][0]
        tasks.append(get_task(n, **{**options.get(suite, {}), **options.get(n, {})}))
    return tasks
