"""The baselines ``score`` adds by spec (``full``, ``uniform:PATTERN``, ``pyramid[:PATTERN]``).

They are built here, at the top layer, because the budgeted ones come from solvers (the uniform and
pyramid solvers; the pyramid schedule needs ``solvers.allocation``'s rounding), which the scoring
core below may not import. Scoring receives them as plain :class:`~polykv_search.scoring.Entry` objects.
"""

from __future__ import annotations

from polykv_search.patterns import checked_params, spec_label
from polykv_search.patterns.spec import parse_params, parse_spec
from polykv_search.scoring import Entry, ScoreError
from solvers import Problem, get_solver
from strategies import Strategy

BASELINE_SPECS = "full | uniform:PATTERN[:KEY=VALUE,...] (or uniform:PATTERN[KEY=VALUE,...]) | pyramid[:PATTERN]"


def baseline(spec: str, num_layers: int, budget: float | None, b_min: int = 1) -> Entry:
    """Build a baseline entry from ``full``, ``uniform:PATTERN`` or ``pyramid[:PATTERN]``."""
    name, _, arg = spec.partition(":")
    if name == "full":
        return Entry("full", Strategy.full(num_layers), "baseline", spec)
    if name not in ("uniform", "pyramid"):
        raise ScoreError(f"unknown baseline {spec!r}; expected {BASELINE_SPECS}")
    if budget is None:
        raise ScoreError(f"baseline {spec!r} needs --budget")
    problem = Problem(global_budget=budget, num_layers=num_layers, b_min=min(b_min, int(budget)))
    if name == "uniform":
        pattern, _, text = arg.partition(":")
        if not pattern:
            raise ScoreError("baseline 'uniform' needs a pattern: uniform:snapkv")
        try:  # uniform:kvzip[allocation=model] and uniform:kvzip:allocation=model name the same entry
            base, params = parse_spec(pattern)
            extra = parse_params(text)
            twice = sorted(set(params) & set(extra))
            if twice:
                raise ValueError(f"parameter {twice[0]!r} is given twice")
            pattern = spec_label(base, checked_params(base, {**params, **extra}))
        except ValueError as err:
            raise ScoreError(f"baseline {spec!r}: {err}") from None
        strategy = get_solver("uniform", pattern=pattern).solve(problem).strategy
        return Entry(f"uniform-{pattern}", strategy, "baseline", spec)
    settings = {"pattern": arg} if arg else {}
    strategy = get_solver("pyramid", **settings).solve(problem).strategy
    return Entry(f"pyramid-{arg}" if arg else "pyramid", strategy, "baseline", spec)


def check_baseline(spec: str, budget: float | None) -> None:
    """Raise :class:`ScoreError` now if ``spec`` cannot be built (before any model is loaded): the spec is
    built for a one-layer model, which checks its name, pattern and budget."""
    baseline(spec, 1, budget)
