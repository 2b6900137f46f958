"""Progress of long work: a bar in a terminal, a plain line every minute in a log (nohup runs)."""

from __future__ import annotations

import io

from rich.console import Console

from polykv_search.progress import ProgressBar


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def log_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=80), buf


def test_a_log_gets_a_line_per_interval_with_count_elapsed_and_time_left():
    console, buf = log_console()
    clock = Clock()
    with ProgressBar(console, "scoring 17 entries", 100, unit="entry×samples", every=60, clock=clock) as bar:
        for _ in range(10):  # 10 units in 30 s: no line yet
            clock.t += 3
            bar.advance()
        assert buf.getvalue() == ""
        clock.t += 30  # 60 s: 11 units done
        bar.advance()
        lines = buf.getvalue().splitlines()
        assert len(lines) == 1
        assert lines[0].endswith("scoring 17 entries: 11/100 entry×samples (11 %), 0:01:00 elapsed, ~0:08:05 left")
        clock.t += 10
        bar.advance(89)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].endswith("100/100 entry×samples (100 %), 0:01:10 elapsed")


def test_time_left_counts_only_the_work_done_in_this_run():
    console, buf = log_console()
    clock = Clock()
    with ProgressBar(console, "collect", 10, completed=5, every=60, clock=clock) as bar:
        clock.t += 60
        bar.advance()  # 1 unit in 60 s, 4 left: 4 min
    assert buf.getvalue().splitlines()[0].endswith("collect: 6/10 (60 %), 0:01:00 elapsed, ~0:04:00 left")


def test_a_terminal_gets_the_live_bar_and_no_plain_lines():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=80)
    with ProgressBar(console, "scoring", 4) as bar:
        assert bar._bar is not None
        bar.advance(4)
    assert "scoring" in buf.getvalue() and "elapsed" not in buf.getvalue()


def test_no_console_shows_nothing_but_still_counts():
    with ProgressBar(None, "quiet", 3) as bar:
        bar.advance(3)
    assert bar.done == 3 and "3/3" in bar.line()
