"""Progress of long work: a bar in a terminal, a plain line every minute in a log (nohup runs)."""

from __future__ import annotations

import io

import pytest
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


def test_weighted_time_left_follows_the_work_not_the_item_count():
    """Ten cheap items (1 s each) come first, then ten that cost ten times as much: after the cheap
    ones the weighted estimate is the true 100 s; counting items would say 10 s."""
    console, buf = log_console()
    clock = Clock()
    costs = [1.0] * 10 + [10.0] * 10
    with ProgressBar(console, "scoring", 20, every=10, clock=clock, work_total=sum(costs)) as bar:
        for cost in costs[:10]:
            clock.t += cost  # seconds proportional to the work
            bar.advance(1, cost)
        assert bar.time_left() == pytest.approx(100.0)
        assert (
            buf.getvalue().splitlines()[-1].endswith("scoring: 10/20 (9 % of the work), 0:00:10 elapsed, ~0:01:40 left")
        )
        for cost in costs[10:15]:
            clock.t += cost
            bar.advance(1, cost)
        assert bar.time_left() == pytest.approx(50.0)


def test_a_weighted_bar_resumes_with_the_work_already_done_and_needs_the_work_of_each_step():
    clock = Clock()
    with ProgressBar(None, "scoring", 4, completed=2, work_total=10.0, work_done=8.0, clock=clock) as bar:
        clock.t += 60
        bar.advance(1, 1.0)  # 1 unit in 60 s, 1 left
        assert bar.time_left() == pytest.approx(60.0)
        with pytest.raises(ValueError, match="work"):
            bar.advance(1)


def test_a_sample_costs_its_decoding_steps_plus_its_prompt():
    from polykv_search.evaluation import get_task
    from polykv_search.evaluation.samples import Sample
    from polykv_search.scoring import run_costs, sample_cost
    from polykv_search.scoring.cost import FORCED_TOKEN_STEPS as F
    from polykv_search.scoring.cost import PROMPT_TOKENS_PER_STEP as K

    cwe, niah, cont = get_task("ruler/cwe"), get_task("ruler/niah_single"), get_task("broad/continuation")
    plain = Sample(id="s", task="t")
    assert sample_cost(cwe, plain, context_len=512) == 120 + 512 / K
    assert sample_cost(niah, plain, context_len=512) == niah.max_new_tokens + 512 / K
    assert sample_cost(niah, plain, context_len=512, max_new_tokens=5) == 5 + 512 / K  # score's override
    forced = Sample(id="c", task="t", target_ids=[1] * 32)
    assert sample_cost(cont, forced, context_len=512) == 512 / K + 32 * F  # no decoding: one forced pass
    costs = run_costs({"a": (cwe, [plain, plain]), "b": (cont, [forced])}, context_len=512)
    assert costs == {
        ("ruler/cwe", 0): 120 + 512 / K,
        ("ruler/cwe", 1): 120 + 512 / K,
        ("broad/continuation", 0): 512 / K + 32 * F,
    }
