"""The uniform guard: a solved strategy checked end to end against every uniform of its patterns.

A table-driven solver adds up per-layer cells, each measured with one layer compressing alone. That
assumption fails where it matters most: evidence lost in one layer is still held by the others, so a
cell barely notices, but a strategy that loses it in many layers loses the answer (issue 26: on
ruler, layer-level ilp stays resolved below uniform kvzip with ``allocation="model"``). The guard runs
the solved strategy and ``uniform-SPEC`` (every allowed pattern at ``floor(B)``, built by the
``uniform`` solver on the same problem) on fresh calibration samples (:func:`guard_samples`: the
table's calibration split and settings, another seed) and measures KL(FullKV ‖ strategy) end to end
(:func:`signals.strategy_kl.strategies_kl`).

Decision (:func:`decide`): the solved strategy stays unless a uniform's KL is *resolved* below it.
For every uniform, the paired difference ``KL(uniform) − KL(solved)`` gets a BCa interval,
stratified by sample kind (prose, evidence: each kind weighs the same whatever the mix), at the
Bonferroni level ``1 − (1 − level) / number of uniforms``, because the best of several uniforms is
picked on the same samples. Among the uniforms whose interval lies below 0, the one with the lowest
mean KL replaces the solved strategy. The guard never tunes on evaluation data: its samples come from
the calibration split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from polykv_search.data import load_corpus
from polykv_search.data.evidence import make_calibration_samples, parse_retrieval_mix
from polykv_search.patterns.spec import parse_spec
from polykv_search.protocol import AGNOSTIC
from polykv_search.stats import LEVEL, Interval, paired_difference_interval, stratified_mean_interval
from signals.strategy_kl import strategies_kl
from solvers.base import Problem, SolverError
from solvers.uniform import UniformSettings, UniformSolver
from strategies import PHASES, Strategy
from strategies.pattern_spec import short_label

#: Seed offset of the guard's samples from the table's calibration seed (fresh windows by default).
SEED_OFFSET = 1
#: The most calibration samples a measurement of whole strategies draws (the guard, ``search``, ``pool-prior``):
#: all are generated before the first runs, each keeps its FullKV reference (``[span, vocabulary]`` floats, 6 MB
#: for SmolLM2 at 32 tokens) and costs a model run per strategy (minutes at 1,024 tokens on a CPU).
MAX_SAMPLES = 1_000


@dataclass(frozen=True)
class GuardResult:
    """The guard's measurements and choice.

    Attributes
    ----------
    names : list of str
        ``names[0]`` is the solved strategy (its solver's name), then ``uniform-SPEC`` per pattern.
    kl : ndarray, shape (n_samples, n_names)
        Per-sample mean KL(FullKV ‖ strategy) over each sample's scored span.
    kinds : list of str
        Per sample, ``"prose"`` or ``"evidence"``: the strata of every interval.
    means : dict
        Per name, the mean over kinds of the per-kind mean KL, with its interval at ``level``.
    versus : dict
        Per uniform, ``KL(uniform) − KL(solved)`` with its interval at ``test_level``.
    chosen : str
        The name whose strategy the guard returns.
    level, test_level : float
        The reporting level, and the Bonferroni level of the comparisons.
    samples : dict
        How the samples were drawn (seed, mix, windows shared with the table's samples).
    """

    names: list[str]
    kl: np.ndarray
    kinds: list[str]
    means: dict[str, Interval]
    versus: dict[str, Interval]
    chosen: str
    level: float
    test_level: float
    samples: dict[str, Any] = field(default_factory=dict)

    @property
    def replaced(self) -> bool:
        return self.chosen != self.names[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "replaced": self.replaced,
            "solved": self.names[0],
            "metric": "mean KL(FullKV || strategy) over each sample's scored span, whole model, both phases",
            "level": self.level,
            "test_level": self.test_level,
            "means": {k: v.to_json() for k, v in self.means.items()},
            "versus_solved": {k: v.to_json() for k, v in self.versus.items()},
            "kinds": list(self.kinds),
            "per_sample": {n: [float(x) for x in self.kl[:, j]] for j, n in enumerate(self.names)},
            "samples": dict(self.samples),
        }


def strata(values: np.ndarray, kinds: Sequence[str]) -> list[np.ndarray]:
    """``values`` split by sample kind (sorted kinds): the strata of every interval."""
    return [values[[i for i, k in enumerate(kinds) if k == kind]] for kind in sorted(set(kinds))]


def decide(
    kl: np.ndarray, names: Sequence[str], kinds: Sequence[str], *, level: float = LEVEL, seed: int = 0
) -> GuardResult:
    """The :class:`GuardResult` of a measured ``kl`` matrix (column 0: the solved strategy)."""
    kl = np.asarray(kl, dtype=np.float64)
    if kl.ndim != 2 or kl.shape[1] != len(names) or kl.shape[0] != len(kinds) or len(names) < 2:
        raise SolverError(f"guard: {kl.shape} KL values for {len(kinds)} samples and {len(names)} strategies")
    test_level = 1.0 - (1.0 - level) / (len(names) - 1)
    means = {n: stratified_mean_interval(strata(kl[:, j], kinds), level=level, seed=seed) for j, n in enumerate(names)}
    solved = strata(kl[:, 0], kinds)
    versus = {
        n: paired_difference_interval(strata(kl[:, j], kinds), solved, level=test_level, seed=seed)
        for j, n in enumerate(names)
        if j
    }
    better = [n for n, iv in versus.items() if iv.high < 0.0]
    chosen = min(better, key=lambda n: means[n].estimate) if better else names[0]
    return GuardResult(list(names), kl, list(kinds), means, versus, chosen, level, test_level)


def offered_patterns(problem: Problem, solved: Strategy) -> list[str]:
    """The allowed patterns, then every pattern the solved strategy's head groups use that is not among them
    (a head-level solve offers its head patterns too, e.g. KVzip's pool), ``full`` left out."""
    out = [p for p in problem.allowed_patterns("guard") if p != "full"]
    seen = {short_label(*parse_spec(p)) for p in out}
    for phase in PHASES:
        for choice in solved.phase(phase):
            for group in choice.head_groups or ():
                key = short_label(group.pattern, group.params)
                if group.pattern != "full" and key not in seen:
                    seen.add(key)
                    out.append(key)
    return out


def uniform_candidates(problem: Problem, solved: Strategy) -> list[tuple[str, Strategy]]:
    """``(uniform-SPEC, strategy)`` for every offered pattern (:func:`offered_patterns`), as the ``uniform``
    solver builds it on ``problem`` (the phases not optimized keep their default); one identical to ``solved``
    is left out."""
    out = []
    for spec in offered_patterns(problem, solved):
        strategy = UniformSolver(UniformSettings(pattern=spec)).solve(problem).strategy
        same = all(strategy.phase(p) == solved.phase(p) for p in PHASES)
        if not same:
            out.append((f"uniform-{spec}", strategy))
    return out


def guard_samples(
    tokenizer, table, n: int, *, seed: int | None = None, mix: str | None = None, protocol: str | None = None
):
    """``n`` calibration samples drawn like the table's (its corpus, calibration split, lengths, evidence
    records) with ``seed`` (default: the table's + :data:`SEED_OFFSET`), ``mix`` (default: the table's share of
    evidence samples) and ``protocol`` (default: the table's; the other one measures whole strategies where the
    query will sit when they are deployed); returns ``(samples, description)``."""
    prov = table.provenance
    calib = prov.get("calibration") or {}
    retrieval = prov.get("retrieval") or {}
    if "spec" not in calib or "seed" not in calib:
        raise SolverError("guard: the table does not record its calibration corpus and seed (collect it again)")
    seed = int(calib["seed"]) + SEED_OFFSET if seed is None else int(seed)
    if mix is None and retrieval.get("evidence_samples"):
        mix = f"{retrieval['evidence_samples'] / (retrieval['evidence_samples'] + retrieval['prose_samples']):.6g}"
    records = int(retrieval.get("records_per_sample") or 4)
    try:
        parsed = parse_retrieval_mix(mix, records=records)
        samples = make_calibration_samples(
            tokenizer,
            load_corpus(calib["spec"]),
            n_samples=n,
            context_len=int(prov["context_len"]),
            continuation_len=int(prov["continuation_len"]),
            seed=seed,
            mix=parsed,
            protocol=protocol or retrieval.get("protocol", AGNOSTIC),
        )
    except ValueError as err:  # DataError is a ValueError
        raise SolverError(f"guard samples: {str(err).splitlines()[0]}") from None
    span = int(prov["context_len"]) + int(prov["continuation_len"])
    table_windows = [tuple(w) for w in calib.get("windows", [])]
    shared = sum(any(d == s.doc_id and abs(o - s.offset) < span for d, o in table_windows) for s in samples)
    description = {
        "n": n,
        "seed": seed,
        "mix": mix,
        "records": records,
        "corpus": calib["spec"],
        "windows_overlapping_the_table": shared,
    }
    if protocol is not None:  # recorded when chosen, so that journals of the table's protocol still resume
        description["protocol"] = protocol
    return samples, description


def run_guard(
    model,
    tokenizer,
    problem: Problem,
    solved_name: str,
    solved: Strategy,
    n: int,
    *,
    seed: int | None = None,
    mix: str | None = None,
    level: float = LEVEL,
    on_start: Callable[[int], Callable[[], None]] | None = None,
) -> tuple[GuardResult, Strategy]:
    """Measure ``solved`` and the uniforms on ``n`` fresh calibration samples; return the result and
    the strategy it keeps. ``on_start(total runs)`` may return a callback advanced after each run."""
    if problem.table is None:
        raise SolverError("guard: needs the signal table (its calibration settings)")
    if not 2 <= n <= MAX_SAMPLES:
        raise SolverError(f"guard: needs at least 2 samples and at most {MAX_SAMPLES:,}, got {n:,}")
    candidates = uniform_candidates(problem, solved)
    if not candidates:
        raise SolverError("guard: the solved strategy is the only uniform of its patterns; nothing to compare")
    samples, description = guard_samples(tokenizer, problem.table, n, seed=seed, mix=mix)
    names = [solved_name] + [name for name, _ in candidates]
    strategies = [solved] + [s for _, s in candidates]
    advance = on_start(len(samples) * len(strategies)) if on_start is not None else None
    kl = strategies_kl(model, samples, strategies, on_done=advance)
    kinds = ["evidence" if getattr(s, "scored", None) is not None else "prose" for s in samples]
    result = decide(kl, names, kinds, level=level)
    result = replace(result, samples=description)
    return result, strategies[names.index(result.chosen)]
