"""Paired differences between entries of results files scored on the same samples, across protocols too.

``compare`` refuses to pair files of different protocols (on purpose: a table should not mix them);
this script pairs by sample id for a study's explicit cross-protocol contrast:

    python docs/study_kvzip/pairs.py AWARE.json:tova AGNOSTIC.json:tova

prints the per-task means and the 95 % paired bootstrap interval (task-stratified, 9,999 resamples,
seed 0; ``polykv_search.stats``) of ``A - B``. Entries are named as in the results file.
"""

import json
import sys

from polykv_search.stats import paired_difference_interval


def per_task(spec: str) -> dict[str, dict[str, float]]:
    path, name = spec.rsplit(":", 1)
    entries = {e["name"]: e for e in json.load(open(path))["entries"]}
    if name not in entries:
        raise SystemExit(f"{path} has no entry {name!r} (it has {', '.join(entries)})")
    return {t: {s["id"]: float(s["score"]) for s in r["per_sample"]} for t, r in entries[name]["tasks"].items()}


def main(a_spec: str, b_spec: str) -> None:
    a, b = per_task(a_spec), per_task(b_spec)
    if sorted(a) != sorted(b) or any(sorted(a[t]) != sorted(b[t]) for t in a):
        raise SystemExit("the two entries were not scored on the same tasks and samples")
    tasks = sorted(a)
    xs = [[a[t][i] for i in sorted(a[t])] for t in tasks]
    ys = [[b[t][i] for i in sorted(a[t])] for t in tasks]
    for t, x, y in zip(tasks, xs, ys):
        print(f"{t:24s} {sum(x) / len(x):6.1f} {sum(y) / len(y):6.1f}  n={len(x)}")
    iv = paired_difference_interval(xs, ys, resamples=9999, seed=0)
    print(f"{a_spec} - {b_spec}: {iv.estimate:+.1f} [{iv.low:.1f}, {iv.high:.1f}]")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
