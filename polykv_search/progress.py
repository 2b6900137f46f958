"""Progress of long work: a rich bar in a terminal, plain timestamped lines in a log.

A study run under ``nohup ... > log`` has no terminal, where a live bar shows nothing until the end;
there :class:`ProgressBar` prints one line every ``every`` seconds (and a last one), with the count,
elapsed time and an estimate of the time left.

Items of unequal cost (a RULER sample that decodes 120 tokens costs many times a teacher-forced
one) are given a ``work`` weight each: the time left is then the remaining *work* over the rate at
which work was done, not the remaining item count over the item rate, which runs far ahead when
cheap items come first. The percentage shown is the share of the work done.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich import progress as rich_progress
from rich.console import Console

#: seconds between two plain progress lines
PLAIN_EVERY_S = 60.0


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class ProgressBar:
    """``with ProgressBar(console, "scoring", total) as bar: bar.advance(n)``.

    Parameters
    ----------
    console
        Where the bar (terminal) or the lines (anything else) go; ``None``: nothing is shown.
    unit
        Shown after the count (e.g. ``"cells×samples"``).
    every
        Seconds between plain lines.
    work_total, work_done
        The work all items / the already finished items stand for (e.g. decode-step equivalents,
        :func:`polykv_search.scoring.cost.sample_cost`); each :meth:`advance` then says how much
        work it finished. Default: one unit of work per item.
    """

    def __init__(
        self,
        console: Console | None,
        description: str,
        total: int,
        *,
        completed: int = 0,
        unit: str = "",
        every: float = PLAIN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        work_total: float | None = None,
        work_done: float = 0.0,
    ):
        self.console, self.description, self.total, self.unit = console, description, total, unit
        self.done, self.every, self.clock = completed, every, clock
        self.weighted = work_total is not None
        self.work_total = float(work_total) if self.weighted else float(total)
        self.work = float(work_done) if self.weighted else float(completed)
        self.start_work = self.work
        self._bar = None
        if console is not None and console.is_terminal:
            # the bar and rich's time left follow the work; the count is shown beside it
            columns = [rich_progress.TextColumn("{task.description}"), rich_progress.BarColumn()]
            columns += [rich_progress.TextColumn("{task.fields[count]}")]
            columns += [rich_progress.TimeElapsedColumn(), rich_progress.TimeRemainingColumn()]
            self._bar = rich_progress.Progress(*columns, console=console)
            self._task = self._bar.add_task(
                description, total=self.work_total, completed=self.work, count=self._count()
            )

    def __enter__(self) -> ProgressBar:
        self.t0 = self.last = self.clock()
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self, n: int = 1, work: float | None = None) -> None:
        """``n`` more items done, standing for ``work`` (required when the bar is weighted)."""
        if self.weighted and work is None:
            raise ValueError("a weighted ProgressBar needs the work of each advance")
        self.done += n
        self.work += n if work is None else work
        if self._bar is not None:
            self._bar.update(self._task, completed=self.work, count=self._count())
        elif self.console is not None and self.clock() - self.last >= self.every:
            self._line()

    def _count(self) -> str:
        return f"{self.done}/{self.total}" + (f" {self.unit}" if self.unit else "")

    def time_left(self) -> float | None:
        """Seconds left: the remaining work at the rate work was done in this run (None before any)."""
        elapsed = self.clock() - self.t0
        rate = (self.work - self.start_work) / elapsed if elapsed > 0 else 0.0
        if not (0 < self.done < self.total and rate > 0):
            return None
        return max(0.0, self.work_total - self.work) / rate

    def line(self) -> str:
        """The plain line for the current state."""
        elapsed = self.clock() - self.t0
        pct = 100.0 * self.work / self.work_total if self.work_total else 100.0
        share = f"{pct:.0f} %" + (" of the work" if self.weighted else "")
        text = f"{self.description}: {self._count()} ({share}), {_clock(elapsed)} elapsed"
        left = self.time_left()
        if left is not None:
            text += f", ~{_clock(left)} left"
        return text

    def _line(self) -> None:
        self.last = self.clock()
        self.console.print(f"{time.strftime('%H:%M:%S')} {self.line()}", highlight=False, soft_wrap=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.console is not None:
            self._line()
