"""What a protocol means for a task: the tasks it refuses and the notes a reader of its scores needs
(question-agnostic or question-aware, :mod:`polykv_search.protocol`)."""

from __future__ import annotations

from polykv_search.protocol import AWARE
from polykv_search.scoring.entries import ScoreError


def check_task_protocol(task, protocol: str) -> None:
    """Refuse (:class:`ScoreError`, one line) a task the protocol has no meaning for: under
    ``question-aware``, a trajectory task (the decode suite), whose question is asked after the
    generated tokens and so can never be prefilled with its prompt."""
    if protocol == AWARE and task.kind == "trajectory":
        raise ScoreError(
            f"{task.name}: the decode suite has no question to compress with its prompt (its question follows "
            "the generated tokens); score it without --question-aware"
        )


def protocol_notes(tasks, protocol: str) -> list[str]:
    """What a reader of this run's scores should know about the protocol (one line each): under
    ``question-aware`` a task whose score the first answer token decides (``Task.first_token_decides``)
    gets that token from the prompt call, before any eviction, so every entry scores FullKV's there
    (measured: studies/kvzip/study_kvzip.md, broad at B = 128)."""
    if protocol != AWARE:
        return []
    return [
        f"{task.name} under --question-aware: its score is decided by the first answer token, predicted by the "
        "prompt call before any eviction, so every entry scores what FullKV scores there"
        for task in tasks
        if task.first_token_decides
    ]
