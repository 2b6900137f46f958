"""One sample as every entry runs it, and what one entry's run of it leaves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SampleJob:
    """The token ids of one sample and how to run them (``kind`` as in :class:`~polykv_search.evaluation.Task`)."""

    kind: str  # "teacher_forced", "generate" or "trajectory"
    context_ids: list[int]
    question_ids: list[int]
    target_ids: list[int] | None = None
    limit: int = 0  # new tokens at most (generate)
    eos: frozenset[int] = frozenset()
    #: trajectory: FullKV greedy-generates this many tokens (EOS banned); every entry is teacher-forced
    #: along them step by step, then answers ``question_ids`` with up to ``limit`` tokens when ``limit > 0``
    generate_len: int = 0
    #: teacher-forced: feed the continuation one token per call (decoding plans evict at every step, as while
    #: generating) instead of in one call
    stepwise: bool = False

    @property
    def teacher_forced(self) -> bool:
        return self.kind == "teacher_forced"

    @property
    def trajectory(self) -> bool:
        return self.kind == "trajectory"

    @property
    def targets(self) -> list[int]:
        """The teacher-forced continuation's ids (``target_ids``, which every teacher-forced job has)."""
        if self.target_ids is None:
            raise ValueError(f"a {self.kind} job has no target ids")
        return self.target_ids


@dataclass
class SampleOutcome:
    """One entry's result on one sample: the continuation outcome dict (teacher-forced) or the
    generated ids, the timing of the calls and the KV bytes held at the end."""

    pred: Any
    timing: dict[str, float]
    kv_bytes: int
    full_kv_bytes: int
    new_ids: list[int] = field(default_factory=list)
    logits: Any = None  #: teacher-forced: the continuation's next-token logits ``[m, V]``
