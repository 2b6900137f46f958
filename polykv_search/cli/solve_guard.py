"""`solve --guard N`: check the solved strategy end to end against every uniform of its patterns."""

from __future__ import annotations

import argparse
from contextlib import ExitStack

from polykv_search.cli.arg_types import at_most, seed_value
from polykv_search.cli.common import CLIError, console, out

#: The flags this module adds to `solve` (they belong to no solver's settings).
GUARD_DESTS = {"guard", "guard_seed", "guard_mix"}

#: Samples per kind below which the guard warns that its intervals are rough.
FEW = 8


def add_guard_args(p: argparse.ArgumentParser) -> None:
    from solvers.guard import MAX_SAMPLES

    g = p.add_argument_group("uniform guard (needs --signals; runs the model)")
    g.add_argument(
        "--guard",
        type=at_most(MAX_SAMPLES, "guard samples", zero=True),
        default=0,
        metavar="N",
        help="measure the solved strategy and every uniform of its patterns end to end (KL to FullKV, both phases) "
        "on N fresh calibration samples; a uniform whose KL is resolved below the solved strategy's replaces it "
        f"(default 0: off; at most {MAX_SAMPLES:,})",
    )
    g.add_argument(
        "--guard-seed",
        type=seed_value,
        default=None,
        metavar="SEED",
        help="seed of the guard's samples (default: the table's seed + 1)",
    )
    g.add_argument(
        "--guard-mix",
        default=None,
        metavar="MIX",
        help="evidence samples among the guard's, a count or a fraction (default: the table's share)",
    )


def check_guard_args(args: argparse.Namespace) -> None:
    from polykv_search.data import DataError
    from polykv_search.data.evidence import parse_retrieval_mix

    if not args.guard and (args.guard_seed is not None or args.guard_mix is not None):
        raise CLIError("--guard-seed and --guard-mix apply with --guard N")
    if not args.guard:
        return
    try:
        parse_retrieval_mix(args.guard_mix)
    except DataError as err:
        raise CLIError(f"--guard-mix: {err}") from None
    if args.guard < 2:
        raise CLIError(f"--guard {args.guard}: needs at least 2 samples for an interval")
    if not args.signals:
        raise CLIError("--guard needs --signals: its samples are drawn like the table's")
    if args.method in ("optuna", "search", "pool-prior"):
        raise CLIError(f"--guard does not apply to {args.method}: it measures whole strategies already")


def apply_guard(args: argparse.Namespace, problem, result):
    """Run the guard; returns the strategy to write (the solved one or a uniform) with the guard's
    measurements in its provenance."""
    from polykv_search.models import ModelError, load_model
    from polykv_search.progress import ProgressBar
    from solvers.base import predictions

    prov = problem.table.provenance
    model_args = prov.get("model_args") or {}
    name = args.model or prov.get("model")
    if not name:
        raise CLIError("--guard: the table does not name its model; give --model")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with console.status(f"loading {name} ..."):
            model, tokenizer = load_model(
                name,
                device=model_args.get("device", "cpu"),
                dtype=model_args.get("dtype", "float32"),
                attn_implementation=model_args.get("attn", "sdpa"),
            )
    except (ModelError, ValueError, OSError) as err:
        raise CLIError(f"--guard: cannot load {name!r}: {str(err).splitlines()[0]}") from None
    with ExitStack() as stack:

        def on_start(total: int):
            bar = stack.enter_context(ProgressBar(console, "guard", total, unit="runs"))
            return lambda: bar.advance(1)

        guard, strategy = _run(
            model,
            tokenizer,
            problem,
            args.method,
            result.strategy,
            args.guard,
            seed=args.guard_seed,
            mix=args.guard_mix,
            on_start=on_start,
        )
    strategy.provenance["guard"] = guard.to_json()
    if guard.replaced:  # the solved strategy's predictions are set by `solve`
        strategy.provenance["predicted"] = predictions(problem.table, strategy, problem.phases)
    print_guard(guard)
    return strategy


def _run(*args, **kwargs):
    from solvers.base import SolverError
    from solvers.guard import run_guard

    try:
        return run_guard(*args, **kwargs)
    except SolverError as err:
        raise CLIError(str(err)) from None


def print_guard(guard) -> None:
    from rich.table import Table
    from rich.text import Text

    n = len(guard.kinds)
    kinds = ", ".join(f"{guard.kinds.count(k)} {k}" for k in sorted(set(guard.kinds)))
    table = Table(title=f"uniform guard: KL to FullKV on {n} calibration samples ({kinds})", title_justify="left")
    table.add_column("strategy", overflow="fold")
    table.add_column(f"KL [{guard.level:.0%}]", justify="right")
    table.add_column(f"− solved [{guard.test_level:.1%}]", justify="right")
    for name in guard.names:
        m = guard.means[name]
        row = [Text(name + (" *" if name == guard.chosen else "")), f"{m.estimate:.4f} [{m.low:.4f}, {m.high:.4f}]"]
        v = guard.versus.get(name)
        row.append("" if v is None else f"{v.estimate:+.4f} [{v.low:+.4f}, {v.high:+.4f}]")
        table.add_row(*row)
    out.print(table)
    if "evidence" not in guard.kinds:
        console.print(
            "warning: no guard sample carries evidence, so the guard cannot see what a strategy loses of sparse "
            "evidence (studies/kvzip/study_kvzip.md, H22: prose alone chose uniform h2o over a solve that keeps most "
            "needles)",
            markup=False,
            highlight=False,
        )
    few = {k: guard.kinds.count(k) for k in sorted(set(guard.kinds)) if guard.kinds.count(k) < FEW}
    if few:
        counts = ", ".join(f"{n} {k}" for k, n in few.items())
        console.print(f"warning: {counts} samples; bootstrap intervals from fewer than {FEW} per kind are rough")
    if guard.replaced:
        line = f"guard: {guard.chosen} replaces {guard.names[0]} (its KL is resolved lower at {guard.test_level:.1%})"
    else:
        line = f"guard: {guard.names[0]} stays (no uniform's KL is resolved below it at {guard.test_level:.1%})"
    out.print(line, markup=False, highlight=False)
