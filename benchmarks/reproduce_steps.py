"""The ``collect`` and ``solve`` steps of ``benchmarks/reproduce.py`` (one ``polykv-search`` command each).

With ``--head-level``, a second, head-level table (``signals-heads.json``: retrieval scores and head
cells of streaming_llm, snapkv and h2o on the calibration split, as ``docs/calibration.md``'s
"Combined strategies" measured them) and, at every budget, the head-level entries of issue 25's study:
``duo``, ``headkv``, ``ilp-head`` (keep-all or a (pattern, budget) cell per KV head) and
``ilp-head-streaming`` (the same over the streaming cells alone), each built for ``--context-len``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import NamedTuple

from reproduce_report import signals_path

from polykv_search.cli import main as cli
from polykv_search.cli.quickstart_heads import head_collect_argv

UNIFORM = ("snapkv", "tova", "h2o", "streaming_llm")
METHODS = ("pyramid", "squeeze", "cake", "proportional", "ilp", "dp", "optuna")
#: solved on the retrieval-aware table too (``--retrieval-mix``), as ``<method>-retrieval``
RETRIEVAL_METHODS = ("proportional", "ilp")
#: the solvers that take the ablation settings (--uniform-budgets, --fixed-pattern, --phases)
ABLATABLE = ("proportional", "ilp", "dp")
PENDING = "<calibration-pattern>"  # the ablations' pattern in a plan, before the uniforms are solved


class Step(NamedTuple):
    """One ``polykv-search`` command: its name in the log, its argv and (solve) the file it writes."""

    name: str
    argv: list[str]
    target: Path | None = None


def run_step(s: Step, log: dict) -> Path | None:
    """Run ``s`` unless its target exists (then reuse it); returns the target."""
    if s.target is not None and s.target.exists():
        return s.target
    print(f"\n=== {s.name}: polykv-search {' '.join(s.argv)}", flush=True)
    t0 = time.perf_counter()
    rc = cli(s.argv)
    log[s.name] = round(time.perf_counter() - t0, 1)
    if rc != 0:
        raise SystemExit(f"step {s.name!r} failed (exit {rc})")
    return s.target


def _calibration(args: argparse.Namespace) -> list[str]:
    """``collect`` with the model and calibration settings every table of the study shares."""
    return [
        "collect",
        "--model",
        args.model,
        "--device",
        args.device,
        "--samples",
        str(args.calib_samples),
        "--context-len",
        str(args.calib_context_len),
        "--continuation-len",
        str(args.calib_continuation_len),
    ]


def collect_steps(args: argparse.Namespace) -> list[Step]:
    """The prose-only collection, with ``--retrieval-mix`` the retrieval-aware one (same model, grid,
    calibration corpus, split, seed and lengths, plus the mix) and with ``--head-level`` the head table."""
    argv = [*_calibration(args), "--patterns", args.patterns, "--budgets", args.grid]
    steps = [Step("collect", [*argv, "--out", str(signals_path(args))])]
    if args.retrieval_mix:
        mixed = [*argv, "--retrieval-mix", args.retrieval_mix, "--out", str(signals_path(args, True))]
        steps.append(Step("collect retrieval", mixed))
    if args.head_level:
        steps.append(head_collect_step(args))
    return steps


def _solve(
    args: argparse.Namespace,
    B: str,
    name: str,
    solver_args: list[str],
    *,
    retrieval: bool = False,
    extra: list[str] = (),
    signals: Path | None = None,
) -> Step:
    target = args.out / "strategies" / f"{name}-B{B}.json"
    argv = [
        "solve",
        *solver_args,
        "--signals",
        str(signals or signals_path(args, retrieval)),
        "--budget",
        B,
        "--b-min",
        str(args.b_min),
        *extra,
        "--out",
        str(target),
    ]
    return Step(f"solve {name} B={B}", argv, target)


def uniform_steps(args: argparse.Namespace, B: str) -> dict[str, Step]:
    """The uniform single-pattern strategies at ``B`` (prose-only table)."""
    return {u: _solve(args, B, f"uniform-{u}", ["--method", "uniform", "--pattern", u]) for u in args.uniform}


def strategy_steps(args: argparse.Namespace, B: str, default: str) -> dict[str, Step]:
    """Every scored strategy at ``B`` by entry name (without ``-B<B>``): the methods, the ablations
    (on ``default``, the calibration pattern) and, with ``--retrieval-mix``, the retrieval-aware ones."""
    runs = {m: ["--method", m] for m in METHODS}
    for m in args.ablations_on:
        prefix = "" if m == "proportional" else f"{m}-"
        runs[f"{prefix}patterns-only"] = ["--method", m, "--uniform-budgets"]
        runs[f"{prefix}budgets-only"] = ["--method", m, "--fixed-pattern", default]
        runs[f"{prefix}prefill-only"] = ["--method", m, "--phases", "prefill", "--default-pattern", default]
        runs[f"{prefix}decoding-only"] = ["--method", m, "--phases", "decoding", "--default-pattern", default]
    optuna = [
        "--model",
        args.model,
        "--device",
        args.device,
        "--trials",
        str(args.optuna_trials),
        "--storage",
        str(args.out / "optuna.journal"),
        "--study-name",
        f"repro-B{B}",
        "--samples",
        "1",
        "--context-len",
        str(args.calib_context_len),
    ]
    steps = {name: _solve(args, B, name, a, extra=optuna if name == "optuna" else []) for name, a in runs.items()}
    if args.retrieval_mix:
        for m in RETRIEVAL_METHODS:
            steps[f"{m}-retrieval"] = _solve(args, B, f"{m}-retrieval", ["--method", m], retrieval=True)
    return steps


#: the head-level entries (``--head-level``) by name: their ``solve`` flags beside the head table
HEAD_METHODS = {
    "duo": ["--method", "duo"],
    "headkv": ["--method", "headkv"],
    "ilp-head": ["--method", "ilp", "--granularity", "head"],
    "ilp-head-streaming": ["--method", "ilp", "--granularity", "head", "--head-patterns", "streaming_llm"],
}
HEAD_PATTERNS = "streaming_llm,snapkv,h2o"


def heads_path(args: argparse.Namespace) -> Path:
    return args.out / "signals-heads.json"


def head_collect_step(args: argparse.Namespace) -> Step:
    """The head-level table: retrieval scores on ``--calib-samples`` evidence samples and head cells of
    ``--head-patterns`` at ``--head-grid`` (beside as many prose samples)."""
    patterns = getattr(args, "head_patterns", None) or HEAD_PATTERNS
    argv = head_collect_argv(_calibration(args), args.calib_samples, args.head_grid, patterns, heads_path(args))
    return Step("collect heads", argv, heads_path(args))


def head_steps(args: argparse.Namespace, B: str) -> dict[str, Step]:
    """The head-level entries at ``B`` (empty without ``--head-level``), solved on the head table for
    strategies of ``--context-len`` tokens (a keep-all head keeps all of them)."""
    if not args.head_level:
        return {}
    built_for = ["--target-context-len", str(args.context_len)]
    table = heads_path(args)
    return {name: _solve(args, B, name, flags, extra=built_for, signals=table) for name, flags in HEAD_METHODS.items()}
