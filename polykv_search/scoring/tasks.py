"""The samples every entry of a score run sees: tasks resolved from specs, generated once from the
evaluation split of a corpus."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polykv_search.data import describe_split, load_corpus, split_corpus
from polykv_search.evaluation import tasks_for
from polykv_search.evaluation.base import split_seed
from polykv_search.scoring.entries import ScoreError


def eval_texts(corpus_spec: str, role: str = "eval") -> tuple[list[str], dict[str, Any]]:
    """Haystack texts from the evaluation split (never the calibration documents), and its record.

    ``role="calib"``: the calibration split instead, for designing and diagnosing on calibration samples
    (the record's ``role`` says which split it was)."""
    corpus = load_corpus(corpus_spec)
    return [d.text for d in split_corpus(corpus, role)], describe_split(corpus, role)


def make_task_samples(
    tokenizer,
    tasks: Sequence[Any],
    texts: Sequence[str],
    *,
    n_samples: int,
    context_len: int,
    seed: int,
    role: str = "eval",
) -> dict[str, tuple[Any, list]]:
    """``{task name: (task, samples)}``, generated once and shared by every entry.

    ``role``: the split ``texts`` come from; on the calibration split the tasks draw from
    :func:`~polykv_search.evaluation.base.split_seed`'s seed, so no needle or fact is shared with an
    evaluation sample.

    A request the task cannot meet (a context too short for its fixed text, too little held-out text)
    is a :class:`ScoreError` naming the task.
    """
    out = {}
    for i, task in enumerate(tasks):
        try:
            out[task.name] = (task, task.generate(tokenizer, texts, n_samples, context_len, split_seed(seed + i, role)))
        except ValueError as err:
            raise ScoreError(f"{task.name}: {err}") from None
    return out


def resolve_tasks(spec: str, longbench_source: str | None = None, generate_len: int | None = None) -> list[Any]:
    """Task objects from ``broad,ruler`` or explicit task names (``ruler/vt``); ``generate_len``: the
    decode suite's FullKV trajectory length (default the tasks' own, 512)."""
    options: dict[str, dict[str, Any]] = {"longbench": {"source": longbench_source}} if longbench_source else {}
    if generate_len is not None:
        options["decode"] = {"generate_len": generate_len}
    try:
        return tasks_for(spec, **options)
    except (KeyError, ValueError, TypeError) as err:
        raise ScoreError(str(err).strip("'\"")) from None
