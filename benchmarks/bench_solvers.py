"""Time the exact solvers (ilp, dp) on a 32-layer x 2-phase x 8-pattern x 16-budget signal table.

    python benchmarks/bench_solvers.py [--repeat 3] [--seed 0] [--json out.json]

The asserted table uses a geometric grid like a real collection grid (16 ... 3072) and
B in {64, 128, 256, 512, 1024}. A stress grid (irregular values whose offsets have gcd 1: the dp's
largest state space and HiGHS's hardest knapsacks) and the k-distinct-budgets side constraint are
timed too and reported, but not asserted. For each row, the best of ``--repeat`` wall times of

* the core per-phase solvers on the full 32 x 8 x 16 cost tensor (all 8 pattern columns), summed
  over the two phases, and
* the public ``Solver.solve`` call (table -> validated Strategy; ``full`` is not a budgeted pattern,
  so 7 patterns are allowed), both phases,

and checks that ilp and dp reach the same objective. Asserts every asserted row's times are
< 1 s (the issue's target) and that ilp == dp everywhere; exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from signals import random_signal_table  # noqa: E402
from solvers import Problem, solve  # noqa: E402
from solvers.base import cost_tensor  # noqa: E402
from solvers.dp import solve_phase_dp  # noqa: E402
from solvers.ilp import solve_phase_ilp  # noqa: E402

LAYERS = 32
PATTERNS = ("full", "streaming_llm", "h2o", "tova", "snapkv", "pyramidkv", "knorm", "random")
GRIDS = {
    "geometric": (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072),
    "irregular": (17, 29, 41, 64, 97, 128, 181, 256, 331, 512, 677, 1024, 1361, 2048, 2731, 4096),
}
#: (grid, B, k, asserted)
CASES = [("geometric", B, None, True) for B in (64, 128, 256, 512, 1024)]
CASES += [("irregular", B, None, False) for B in (64, 128, 512, 1024)]
CASES += [("geometric", 128, 2, False), ("geometric", 512, 3, False)]
LIMIT_S = 1.0


def best_of(fn, repeat: int):
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)

    # warm-up: imports (torch via the pattern registry, scipy/HiGHS) are not the solvers' cost
    warm = random_signal_table(4, patterns=PATTERNS[1:3], budgets=(8, 16), seed=0)
    solve("ilp", Problem(table=warm, global_budget=12))
    solve("dp", Problem(table=warm, global_budget=12))

    rows, failures = [], []
    tables = {
        name: random_signal_table(LAYERS, patterns=PATTERNS, budgets=grid, seed=args.seed)
        for name, grid in GRIDS.items()
    }
    for grid_name, B, k, asserted in CASES:
        grid, table = GRIDS[grid_name], tables[grid_name]
        assert table.shape == (32, 2, 8, 16)
        total = math.floor(LAYERS * B)
        costs = [cost_tensor(table, ph, "dppl", range(8), range(16)) for ph in table.phases]
        t_ilp_core, ilp_core = best_of(
            lambda: sum(solve_phase_ilp(c, list(PATTERNS), grid, total, k, 60.0).objective for c in costs), args.repeat
        )
        t_dp_core, dp_core = best_of(
            lambda: sum(solve_phase_dp(c, list(PATTERNS), grid, total, k).objective for c in costs), args.repeat
        )
        problem = Problem(table=table, global_budget=B)
        t_ilp, r_ilp = best_of(lambda: solve("ilp", problem, max_distinct_budgets=k), args.repeat)
        t_dp, r_dp = best_of(lambda: solve("dp", problem, max_distinct_budgets=k), args.repeat)
        agree = math.isclose(ilp_core, dp_core, rel_tol=1e-9, abs_tol=1e-6) and math.isclose(
            r_ilp.objective, r_dp.objective, rel_tol=1e-9, abs_tol=1e-6
        )
        row = {
            "grid": grid_name,
            "B": B,
            "k": k,
            "asserted": asserted,
            "ilp_core_s": t_ilp_core,
            "dp_core_s": t_dp_core,
            "ilp_solve_s": t_ilp,
            "dp_solve_s": t_dp,
            "objective_8pat": dp_core,
            "objective_7pat": r_dp.objective,
            "agree": agree,
        }
        rows.append(row)
        if asserted:
            for key in ("ilp_core_s", "dp_core_s", "ilp_solve_s", "dp_solve_s"):
                if row[key] >= LIMIT_S:
                    failures.append(f"{grid_name} B={B}: {key} = {row[key]:.3f} s >= {LIMIT_S} s")
        if not agree:
            failures.append(f"{grid_name} B={B} k={k}: ilp and dp disagree ({ilp_core} vs {dp_core})")

    print(f"ilp vs dp on a {LAYERS} x 2 x {len(PATTERNS)} x 16 table (best of {args.repeat}, both phases, seconds)")
    head = (
        f"{'grid':<10} {'B':>5} {'k':>2} | {'ilp core':>9} {'dp core':>9} | "
        f"{'ilp solve':>9} {'dp solve':>9} | {'objective':>10} agree  < 1 s"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['grid']:<10} {r['B']:>5} {r['k'] or '-':>2} | {r['ilp_core_s']:>9.4f} {r['dp_core_s']:>9.4f} | "
            f"{r['ilp_solve_s']:>9.4f} {r['dp_solve_s']:>9.4f} | {r['objective_8pat']:>10.4f} "
            f"{'yes' if r['agree'] else 'NO':<5}  "
            f"{'asserted' if r['asserted'] else 'reported'}"
        )
    print(
        "core = per-phase solvers on the 8-pattern cost tensor; "
        "solve = Solver.solve -> validated Strategy (7 budgeted patterns)"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    for f in failures:
        print("FAIL:", f)
    assert not failures, f"{len(failures)} check(s) failed"
    print(f"OK: every asserted time < {LIMIT_S} s and ilp == dp on every row")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
