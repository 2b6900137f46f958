"""The whole-model search's loop: pick the better start, then accept only moves resolved better.

Start
    Every start (the calibrated solve, then the uniforms offered) is measured on the calibration samples. The
    calibrated solve is the start unless others are resolved below it by the guard's rule (as a move is, the
    solve in column 0); then the lowest of those. A lower mean inside its interval does not move the start: on
    8 samples the lowest mean once chose a uniform that collapses on retrieval (studies/ladder, S5).

Rounds
    From the current strategy, the moves not yet tried there are visited in an order drawn from
    ``(seed, moves accepted so far)``; the first ``neighbors`` that change the strategy are measured. A move is
    accepted by the guard's rule (:func:`solvers.guard.decide`, the current strategy in column 0): among the
    candidates whose paired difference ``KL(candidate) − KL(current)`` has its interval (BCa, stratified by
    sample kind, at the Bonferroni level ``1 − (1 − level) / candidates``) entirely below 0, the lowest mean.
    Otherwise the round's moves are marked tried and the next round draws others. The search stops after
    ``max_moves`` accepted moves, ``max_evaluations`` strategies measured (starts included), or when no
    untried move is left.

Guarantee
    Each accepted move is resolved better than the strategy before it. At the end, the result is compared
    with the start on the same samples (paired interval at ``level``); if the chain of moves is not resolved
    below the start as a whole, the last state that is resolved below it is returned (the start if none). So
    the result *is* the start or a resolved improvement over it, by construction.

The loop depends only on ``objective(strategies) -> [n_samples, n]``, so a deterministic objective gives
the same path on a rerun (the journal's values make a resumed search retrace its steps without running
the model).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polykv_search.stats import LEVEL, Interval, paired_difference_interval, stratified_mean_interval
from solvers.guard import decide, strata
from solvers.search_space import Move, SearchSpace
from strategies import Strategy

Objective = Callable[[Sequence[Strategy]], np.ndarray]


@dataclass(frozen=True)
class Step:
    """One accepted move: what it did, the strategy it gave, and its resolved difference."""

    move: Move
    label: str
    digest: str
    mean: Interval  #: the new strategy's KL (level)
    versus: Interval  #: KL(new) − KL(before) (test level)
    candidates: int  #: moves measured in its round

    def to_json(self) -> dict[str, Any]:
        return {
            "move": self.move.to_json(),
            "label": self.label,
            "digest": self.digest,
            "kl": self.mean.to_json(),
            "versus_before": self.versus.to_json(),
            "candidates_in_round": self.candidates,
        }


@dataclass
class SearchTrace:
    """What the search did (the strategy's provenance ``search`` is :meth:`to_json`)."""

    start: str
    starts: dict[str, Interval]  #: every start's mean KL
    versus_starts: dict[str, Interval]  #: KL(result) − KL(start) for every start (level)
    steps: list[Step]
    result: Strategy
    values: np.ndarray  #: the result's per-sample KL
    start_values: np.ndarray
    kinds: list[str]
    evaluated: int  #: strategies measured (starts included; journal hits count)
    rounds: int
    stop: str
    final: Interval | None  #: KL(result) − KL(start), or None when the result is the start
    kept_steps: int  #: accepted moves the result keeps (fewer only when the final check steps back)
    level: float
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "starts": {k: v.to_json() for k, v in self.starts.items()},
            "result_minus_each_start": {k: v.to_json() for k, v in self.versus_starts.items()},
            "moves": [s.to_json() for s in self.steps],
            "moves_kept": self.kept_steps,
            "result_minus_start": None if self.final is None else self.final.to_json(),
            "strategies_evaluated": self.evaluated,
            "rounds": self.rounds,
            "stopped": self.stop,
            "level": self.level,
            "kinds": list(self.kinds),
            "per_sample": {"result": [float(x) for x in self.values], "start": [float(x) for x in self.start_values]},
            "wall_s": round(self.wall_s, 3),
            **self.extra,
        }


def local_search(
    starts: Sequence[tuple[str, Strategy]],
    space_for: Callable[[Strategy], SearchSpace],
    objective: Objective,
    kinds: Sequence[str],
    *,
    neighbors: int = 4,
    max_moves: int = 10,
    max_evaluations: int = 60,
    level: float = LEVEL,
    seed: int = 0,
    check: Callable[[Strategy], None] | None = None,
) -> SearchTrace:
    """Run the search (module docstring); ``space_for(start)`` gives the moves around the chosen start and
    ``check`` is called on every strategy built (the budget constraints)."""
    begin = time.perf_counter()
    kinds = list(kinds)
    names = [n for n, _ in starts]
    values = objective([s for _, s in starts])
    if len(starts) > 1:  # the guard's rule, the calibrated solve in column 0 (its means are the starts')
        opening = decide(values, names, kinds, level=level, seed=seed)
        means, first = opening.means, names.index(opening.chosen)
    else:
        means, first = {names[0]: stratified_mean_interval(strata(values[:, 0], kinds), level=level, seed=seed)}, 0
    current, cur = starts[first][1], values[:, first]
    space = space_for(current)
    history = [(current, cur)]
    steps: list[Step] = []
    tried: set[int] = set()
    evaluated, rounds, stop = len(starts), 0, "max_moves"
    while len(steps) < max_moves:
        if evaluated >= max_evaluations:
            stop = "max_evaluations"
            break
        moves = space.moves(current)
        order = np.random.default_rng([seed, len(steps)]).permutation(len(moves))
        batch: list[tuple[Move, Strategy]] = []
        want = min(neighbors, max_evaluations - evaluated)
        for idx in (int(i) for i in order):
            if len(batch) == want:
                break
            if idx in tried:
                continue
            tried.add(idx)
            candidate = space.apply(current, moves[idx])
            if candidate is None or candidate.digest() == current.digest():
                continue
            if check is not None:
                check(candidate)
            batch.append((moves[idx], candidate))
        if not batch:
            stop = "no untried move"
            break
        rounds += 1
        measured = objective([c for _, c in batch])
        evaluated += len(batch)
        labels = [f"move-{k}" for k in range(len(batch))]
        g = decide(np.column_stack([cur, measured]), ["current", *labels], kinds, level=level, seed=seed)
        if not g.replaced:
            continue
        k = labels.index(g.chosen)
        move, current = batch[k]
        cur = measured[:, k]
        steps.append(
            Step(move, move.label(space.blocks), current.digest(), g.means[g.chosen], g.versus[g.chosen], len(batch))
        )
        history.append((current, cur))
        tried = set()
    result, values_r, final, kept = _final_check(history, kinds, level, seed)
    mine = strata(values_r, kinds)
    versus = {
        n: paired_difference_interval(mine, strata(values[:, j], kinds), level=level, seed=seed)
        for j, n in enumerate(names)
    }
    return SearchTrace(
        start=names[first],
        starts=means,
        versus_starts=versus,
        steps=steps,
        result=result,
        values=values_r,
        start_values=history[0][1],
        kinds=kinds,
        evaluated=evaluated,
        rounds=rounds,
        stop=stop,
        final=final,
        kept_steps=kept,
        level=level,
        wall_s=time.perf_counter() - begin,
    )


def _final_check(history, kinds, level: float, seed: int):
    """The last state of ``history`` resolved below its first (the start), or the start."""
    start_values = strata(history[0][1], kinds)
    for kept in range(len(history) - 1, 0, -1):
        strategy, values = history[kept]
        iv = paired_difference_interval(strata(values, kinds), start_values, level=level, seed=seed)
        if iv.high < 0.0:
            return strategy, values, iv, kept
    return history[0][0], history[0][1], None, 0
