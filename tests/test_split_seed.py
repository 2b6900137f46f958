"""Calibration samples never share a needle, key or fact with the evaluation sample of the same seed and index
(``score --split calib``, the diagnosis scripts); evaluation samples are what they always were."""

from __future__ import annotations

import pytest

from polykv_search import scoring
from polykv_search.evaluation.base import split_seed
from tests.test_eval_support import char_tokenizer, haystack_texts

TASKS = "decode/recall,ruler/niah_single,ruler/niah_multikey,ruler/niah_multivalue"


def draw(role: str | None, seed: int = 0) -> dict:
    tasks = scoring.resolve_tasks(TASKS, generate_len=16)
    kwargs = {} if role is None else {"role": role}
    made = scoring.make_task_samples(
        char_tokenizer(), tasks, haystack_texts(), n_samples=3, context_len=600, seed=seed, **kwargs
    )
    return {name: samples for name, (_, samples) in made.items()}


def test_the_evaluation_split_draws_from_the_seed_itself():
    assert split_seed(7, "eval") == 7
    assert [s.id for s in draw("eval")["ruler/niah_single"]] == [s.id for s in draw(None)["ruler/niah_single"]]
    assert draw("eval")["decode/recall"][0].answers == draw(None)["decode/recall"][0].answers


@pytest.mark.parametrize("seed", [0, 40])
def test_a_calibration_sample_shares_no_answer_with_the_evaluation_sample_of_its_index(seed):
    evaluation, calibration = draw("eval", seed), draw("calib", seed)
    for task, samples in evaluation.items():
        for e, c in zip(samples, calibration[task], strict=True):
            assert e.id != c.id
            assert not set(map(str, e.answers)) & set(map(str, c.answers)), (task, e.answers, c.answers)


def test_the_calibration_seed_is_stable_and_differs_by_seed():
    assert split_seed(0, "calib") == split_seed(0, "calib") != split_seed(1, "calib")
    assert split_seed(0, "calib") != 0
