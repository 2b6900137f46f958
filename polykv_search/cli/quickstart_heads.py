"""quickstart's head-level entry (``--head-level``, on by default): the strategy that keeps needles.

Every layer-level strategy loses ruler's sparse evidence (every per-layer scorer evicts a needle's few
tokens in every head); a few retrieval heads kept whole, the other heads evicting or sharing KVzip's pool,
do not (studies/kvzip/study_kvzip.md, issues 25 and 26). So the quickstart collects a second, small table —
per-KV-head retrieval scores and head cells on the same calibration split
(:mod:`polykv_search.cli.collect_heads`) — and scores ``ilp --granularity head`` on it beside the
layer-level strategies: per KV head, keep every token or one (pattern, budget) cell, under the same
global budget B; the heads given ``kvzip[allocation=model]`` share one pool over the model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from polykv_search.cli.arg_types import comma_list, pattern_specs, positive_int
from polykv_search.cli.common import CLIError
from polykv_search.cli.quickstart_defaults import HEAD_CELLS, HEAD_LEVEL, HEAD_PATTERNS

#: the head-level table, beside signals.json; its solved strategy, beside the layer-level ones
HEADS_TABLE = "signals-heads.json"
HEAD_STRATEGY = "ilp-head"
#: solvers that read the per-KV-head retrieval scores: ``--methods`` solves them on the head-level table
HEAD_SIGNAL_METHODS = ("duo", "headkv")


def add_args(p) -> None:
    """``--head-level/--no-head-level``, ``--head-cells`` and ``--head-patterns``."""
    p.add_argument(
        "--head-level",
        action=argparse.BooleanOptionalAction,
        default=HEAD_LEVEL,
        help="also collect per-KV-head retrieval scores and head cells (signals-heads.json) and score the "
        "head-level ilp, which may keep a few heads whole (default on; --no-head-level skips it)",
    )
    p.add_argument(
        "--head-cells",
        type=comma_list(positive_int, "budget"),
        default=HEAD_CELLS,
        help=f"head-cell budgets of --head-level (default {HEAD_CELLS})",
    )
    p.add_argument(
        "--head-patterns",
        type=pattern_specs(),
        default=HEAD_PATTERNS,
        help=f"head-cell patterns of --head-level, names or specs (default {HEAD_PATTERNS})",
    )


def head_collect_argv(calibration: list[str], samples: int, cells: str, patterns: str, out: Path) -> list[str]:
    """``collect`` for a head-level table: retrieval scores on ``samples`` evidence samples and head
    cells at ``cells`` for ``patterns`` (beside as many prose samples). ``calibration`` is ``collect``
    with the model and calibration settings; the table's layer-level grid is one cell, which no head
    solver reads."""
    return [
        *calibration,
        "--retrieval-heads",
        str(samples),
        "--head-cells",
        cells,
        "--head-patterns",
        patterns,
        "--patterns",
        "snapkv",
        "--budgets",
        cells.split(",")[0],
        "--phases",
        "prefill",
        "--layers",
        "0",
        "--out",
        str(out),
    ]


def head_solve_argv(table: Path, budget: str, context_len: int, out: Path) -> list[str]:
    """``solve`` of the head-level ilp at ``budget``, built for ``context_len``-token prompts (a head
    that keeps every token holds that many, which the budget counts)."""
    return [
        "solve",
        "--method",
        "ilp",
        "--granularity",
        "head",
        "--signals",
        str(table),
        "--budget",
        budget,
        "--target-context-len",
        str(context_len),
        "--out",
        str(out),
    ]


def check_head_methods(methods: list[str], head_level: bool) -> None:
    """Refuse a ``--methods`` solver that reads per-KV-head retrieval scores when ``--no-head-level`` leaves
    them uncollected (one line, before any step runs)."""
    wanted = [m for m in methods if m in HEAD_SIGNAL_METHODS]
    if wanted and not head_level:
        raise CLIError(
            f"--methods {wanted[0]}: reads per-KV-head retrieval scores, which only --head-level collects "
            f"({HEADS_TABLE}); drop --no-head-level or the method"
        )


def method_solve_args(method: str, layer_table: Path, heads_table: Path, context_len: int) -> list[str]:
    """``solve``'s table for ``method`` (a head-signal solver reads the head-level table, built for
    ``context_len``-token prompts, as the head-level ilp is)."""
    if method in HEAD_SIGNAL_METHODS:
        return ["--signals", str(heads_table), "--target-context-len", str(context_len)]
    return ["--signals", str(layer_table)]


def check_head_level(calib_samples: int, cells: list[int], context_len: int) -> None:
    """Refuse ``--head-level`` with fewer calibration samples than retrieval scores need, or a head
    cell that holds the whole calibration context (one line naming the option)."""
    from polykv_search.cli.collect_heads import MIN_RETRIEVAL_SAMPLES

    if max(cells) >= context_len:
        raise CLIError(f"--head-cells: budgets must be below --context-len {context_len}, got {max(cells)}")
    if calib_samples < MIN_RETRIEVAL_SAMPLES:
        raise CLIError(
            f"--head-level needs --calib-samples of at least {MIN_RETRIEVAL_SAMPLES} (its retrieval heads), "
            f"got {calib_samples}; give more or --no-head-level"
        )
