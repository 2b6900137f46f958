"""The hand-made results files of the compare tests and small helpers (the loaded files are the ``v1`` and
``v2`` fixtures of ``tests/conftest.py``).

``tests/fixtures/results_v1.json`` and ``results_v2.json`` are hand-made results of one run: 13 entries
(FullKV, 4 uniform baselines, pyramid, 7 solver strategies) at B = 64, 2 suites (broad: continuation,
manyshot; ruler: niah_single, vt), 12 samples per task with per-sample scores; v2 adds per-sample
KL / ΔNLL on broad/continuation, ``provenance.engine`` and null entry seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from polykv_search import compare as cmp

FIXTURES = Path(__file__).parent / "fixtures"
V1, V2 = FIXTURES / "results_v1.json", FIXTURES / "results_v2.json"
SUITE_TASKS = {"broad": ["broad/continuation", "broad/manyshot"], "ruler": ["ruler/niah_single", "ruler/vt"]}


def row(c: cmp.Comparison, name: str) -> cmp.Row:
    (r,) = [r for r in c.rows if r.name == name]
    return r


def per_sample(r: cmp.Row, suite: str, measure: str = "score") -> list[np.ndarray]:
    return [np.asarray(r.samples[t].values(measure)) for t in SUITE_TASKS[suite]]


def write(tmp_path, name: str, d: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return str(path)
