"""Progress of long work: a rich bar in a terminal, plain timestamped lines in a log.

A study run under ``nohup ... > log`` has no terminal, where a live bar shows nothing until the end;
there :class:`ProgressBar` prints one line every ``every`` seconds (and a last one), with the count,
elapsed time and an estimate of the time left.
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
    ):
        self.console, self.description, self.total, self.unit = console, description, total, unit
        self.done, self.start_done, self.every, self.clock = completed, completed, every, clock
        self._bar = None
        if console is not None and console.is_terminal:
            columns = [rich_progress.TextColumn("{task.description}"), rich_progress.BarColumn()]
            columns += [rich_progress.MofNCompleteColumn()]
            columns += [rich_progress.TextColumn(unit)] if unit else []
            columns += [rich_progress.TimeElapsedColumn(), rich_progress.TimeRemainingColumn()]
            self._bar = rich_progress.Progress(*columns, console=console)
            self._task = self._bar.add_task(description, total=total, completed=completed)

    def __enter__(self) -> ProgressBar:
        self.t0 = self.last = self.clock()
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.advance(self._task, n)
        elif self.console is not None and self.clock() - self.last >= self.every:
            self._line()

    def line(self) -> str:
        """The plain line for the current state."""
        elapsed = self.clock() - self.t0
        count = f"{self.done}/{self.total}" + (f" {self.unit}" if self.unit else "")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        text = f"{self.description}: {count} ({pct:.0f} %), {_clock(elapsed)} elapsed"
        rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
        if 0 < self.done < self.total and rate > 0:
            text += f", ~{_clock((self.total - self.done) / rate)} left"
        return text

    def _line(self) -> None:
        self.last = self.clock()
        self.console.print(f"{time.strftime('%H:%M:%S')} {self.line()}", highlight=False, soft_wrap=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.console is not None:
            self._line()
