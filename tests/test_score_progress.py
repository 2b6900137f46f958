"""`polykv-search score` weighs its time left by each sample's cost (decoding steps plus prompt),
including on a resumed run, where the replayed samples' work counts as done."""

from __future__ import annotations

import pytest

from polykv_search.cli import main
from polykv_search.cli import score as score_cli
from polykv_search.progress import ProgressBar
from polykv_search.scoring.cost import PROMPT_TOKENS_PER_STEP as K
from tests.test_score_cli import checkpoint, score_argv  # noqa: F401  (the tiny model fixture)
from tests.test_score_resume import counted, stop_after  # noqa: F401

# score_argv: 3 samples of broad/continuation (300-token context, teacher-forced) and of
# ruler/niah_single (300-token context, --max-new-tokens 5); the continuation's length is read back
NIAH = 5 + 300 / K


@pytest.fixture
def bars(monkeypatch):
    made: list[ProgressBar] = []

    class Recording(ProgressBar):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.steps: list[tuple[int, float | None]] = []
            made.append(self)

        def advance(self, n=1, work=None):
            self.steps.append((n, work))
            super().advance(n, work)

    monkeypatch.setattr(score_cli, "ProgressBar", Recording)
    return made


def test_each_sample_advances_the_bar_by_its_cost(checkpoint, tmp_path, bars):  # noqa: F811
    assert main(score_argv(checkpoint, tmp_path / "r.json")) == 0
    (bar,) = bars
    assert bar.weighted and [n for n, _ in bar.steps] == [3] * 6  # 3 entries a sample
    cont, niah = [w for _, w in bar.steps[:3]], [w for _, w in bar.steps[3:]]
    assert len(set(cont)) == 1 and cont[0] > 300 / K  # the context pass and the forced continuation
    assert niah == [pytest.approx(NIAH)] * 3  # 5 decoding steps + the prompt
    assert bar.work_total == pytest.approx(sum(cont) + sum(niah)) and bar.work == pytest.approx(bar.work_total)


def test_a_resumed_run_counts_the_replayed_work_as_done(checkpoint, tmp_path, counted, bars):  # noqa: F811
    out = tmp_path / "resumed.json"
    stop_after(checkpoint, out, counted, 4)  # 3 continuation samples and 1 niah sample finished
    bars.clear()
    assert main(score_argv(checkpoint, out)) == 0
    (bar,) = bars
    assert bar.start_work == pytest.approx(bar.work_total - 2 * NIAH)
    assert [w for _, w in bar.steps] == [pytest.approx(NIAH)] * 2
