"""A quickstart results file cut to its first N samples per task: what a run at N samples per task scores.

Sample i of a task does not depend on how many samples are drawn (``make_task_samples``: checked for the
quickstart's tasks), nor does an entry's record of a sample on the other samples or entries (the shared
engine; a fresh ``score --samples 1`` on the first three tasks gave the 2026-12-07 run's first records bit
for bit), so the first N records per task are the N-sample run's. Task scores are recomputed as the mean of
the kept per-sample scores and fidelity as the mean of their KL and ΔNLL (both checked to reproduce the
file's own figures at its full size); perplexity, which pools tokens, is dropped.

    python studies/quickstart/first_samples.py results-B128.json 7 results-first7.json
    python -m polykv_search compare results-first7.json --json compare-first7.json
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np


def first_samples(doc: dict, n: int) -> dict:
    """``doc`` (a results file) with its first ``n`` samples per task; raises if a task score is not a mean."""
    for entry in doc["entries"]:
        for name, task in entry["tasks"].items():
            rows = task["per_sample"]
            assert math.isclose(np.mean([r["score"] for r in rows]), float(task["score"]), rel_tol=1e-9), name
            task["per_sample"], task["predictions"], task["n_samples"] = rows[:n], task["predictions"][:n], n
            task["score"] = entry["scores"][name] = float(np.mean([r["score"] for r in task["per_sample"]]))
            for key in ("kl", "dnll"):
                if key in task["extra"]:
                    assert math.isclose(np.mean([r[key] for r in rows]), task["extra"][key], rel_tol=1e-9), name
                    task["extra"][key] = float(np.mean([r[key] for r in task["per_sample"]]))
            task["extra"].pop("ppl", None), task["extra"].pop("tokens", None)
            if name in entry.get("extra", {}):
                entry["extra"][name] = task["extra"]
        suites: dict[str, list[float]] = {}
        for task in entry["tasks"].values():
            suites.setdefault(task["suite"], []).append(task["score"])
        entry["suites"] = {suite: float(np.mean(scores)) for suite, scores in suites.items()}
        rows = [r for task in entry["tasks"].values() for r in task["per_sample"]]
        entry["kv_bytes"] = float(np.mean([r["kv_bytes"] for r in rows]))
        entry["full_kv_bytes"] = float(np.mean([r["full_kv_bytes"] for r in rows]))
        entry["kv_ratio"] = entry["kv_bytes"] / entry["full_kv_bytes"]
    doc["provenance"]["settings"]["samples"] = n
    return doc


if __name__ == "__main__":
    source, count, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(source) as f:
        cut = first_samples(json.load(f), count)
    with open(target, "w") as f:
        json.dump(cut, f)
