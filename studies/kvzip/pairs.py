"""Paired differences between entries of results files scored on the same samples, across protocols too.

``compare`` refuses to pair files of different protocols (on purpose: a table should not mix them);
this script pairs by sample id for a study's explicit cross-protocol contrast:

    python -m studies.kvzip.pairs AWARE.json:tova AGNOSTIC.json:tova
    python -m studies.kvzip.pairs --metric kl R.json:ilp-widened R.json:uniform-h2o
    python -m studies.kvzip.pairs 'h13-agnostic-*.json:uniform-kvzip' 'h13-agnostic-*.json:uniform-tova'

prints the per-task means and the 95 % paired bootstrap interval (task-stratified, 9,999 resamples,
seed 0; ``polykv_search.stats``) of ``A - B``. Entries are named as in the results file. ``--metric``
names the per-sample field (default ``score``; ``kl``: KL(FullKV || entry), on the tasks that record it).
A path may be a glob or a comma-separated list: task shards of one run (one file per task) or draws of one
task (disjoint sample ids), merged by task; files without the entry are passed over, and the two sides must
end up with the same tasks and sample ids. ``--tasks niah_single,niah_multikey`` pairs only those tasks. A path
or glob that names no file is looked for compressed (``.xz``), as ``studies/kvzip/`` stores its results files.
Run from the repository root.
"""

import argparse
import glob
import json

from polykv_search.io import read_text
from polykv_search.stats import paired_difference_interval


def per_task(spec: str, metric: str) -> dict[str, dict[str, float]]:
    paths, name = spec.rsplit(":", 1)
    files = sorted(f for p in paths.split(",") for f in (glob.glob(p) or glob.glob(p + ".xz") or [p]))
    out: dict[str, dict[str, float]] = {}
    found = {path: e for path in files for e in json.loads(read_text(path))["entries"] if e["name"] == name}
    if not found:
        raise SystemExit(f"no file of {files} has an entry {name!r}")
    holding = list(found)
    for entry in found.values():
        for t, r in entry["tasks"].items():
            if not all(s.get(metric) is not None for s in r["per_sample"]):
                continue
            ids = {s["id"]: float(s[metric]) for s in r["per_sample"]}
            if ids.keys() & out.get(t, {}).keys():
                raise SystemExit(f"samples of task {t} of {name!r} are in more than one of {holding}")
            out.setdefault(t, {}).update(ids)
    return out


def main(a_spec: str, b_spec: str, metric: str = "score", tasks: str | None = None) -> None:
    a, b = per_task(a_spec, metric), per_task(b_spec, metric)
    if tasks:
        keep = {t if "/" in t else f"ruler/{t}" for t in tasks.split(",")}
        a, b = ({t: v for t, v in side.items() if t in keep} for side in (a, b))
    if not a or sorted(a) != sorted(b) or any(sorted(a[t]) != sorted(b[t]) for t in a):
        raise SystemExit(f"the two entries were not scored on the same tasks and samples (metric {metric!r})")
    tasks = sorted(a)
    xs = [[a[t][i] for i in sorted(a[t])] for t in tasks]
    ys = [[b[t][i] for i in sorted(a[t])] for t in tasks]
    digits = 1 if metric == "score" else 4
    for t, x, y in zip(tasks, xs, ys):
        print(f"{t:24s} {sum(x) / len(x):8.{digits}f} {sum(y) / len(y):8.{digits}f}  n={len(x)}")
    iv = paired_difference_interval(xs, ys, resamples=9999, seed=0)
    print(f"{a_spec} - {b_spec} ({metric}): {iv.estimate:+.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("a", metavar="A.json:ENTRY")
    ap.add_argument("b", metavar="B.json:ENTRY")
    ap.add_argument("--metric", default="score", help="per-sample field to pair (default score; e.g. kl)")
    ap.add_argument("--tasks", help="only these tasks, comma-separated (a name without '/' is ruler's)")
    args = ap.parse_args()
    main(args.a, args.b, args.metric, args.tasks)
