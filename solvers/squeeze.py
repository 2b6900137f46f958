"""``squeeze``: SqueezeAttention's layer-wise budget (Wang, Cui & Gan, ICLR 2025, arXiv 2404.04793).

The paper measures each layer's importance by the cosine similarity between the hidden states
before and after its self-attention during prefill (high cosine = the layer changes little = less
important), clusters the layers into 3 groups with k-means on that cosine, and gives the group
with the highest cosine a squeezed budget ``p·b`` (``p`` = ``squeeze_factor``); the tokens saved
are spread evenly over the other layers, so the total is unchanged.

Offline version here: the per-layer signal is the table's cosine at the reference budget (default:
the grid value closest to B) for the solver's pattern (the mean over the allowed patterns if the
pattern is not in the table) -- a high cosine means evicting in that layer hurts least, the same
reading as the paper's. Per optimized phase:

* exact 1-D k-means (optimal partition of the sorted values, deterministic; fewer groups when
  there are fewer distinct values, uniform when all are equal);
* the group with the highest mean cosine gets ``p·B`` per layer, the others
  ``B + (1 − p)·B·n_red/(L − n_red)``;
* :func:`~solvers.base.allocate` shifts these targets by a common offset so that
  ``Σ b_l = floor(L·B)``, ``b_l >= b_min``, ``b_l <= max_budget``, and rounds by largest remainder.

The pattern is a setting (default ``snapkv``) used in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polykv_search.patterns import PATTERNS
from solvers.base import Plan, Problem, Settings, Solver, SolverError, allocate, setting


@dataclass(frozen=True)
class SqueezeSettings(Settings):
    pattern: str = setting("snapkv", "pattern used in every layer")
    squeeze_factor: float = setting(0.5, "p: the most redundant group gets p*B per layer (0 < p <= 1)")
    clusters: int = setting(3, "k-means groups (the paper uses 3)")
    reference_budget: int | None = setting(None, "grid budget where cosine is read (default: grid value closest to B)")

    def check(self) -> None:
        if self.pattern not in PATTERNS or self.pattern == "full":
            raise SolverError(f"pattern: {self.pattern!r} is not a budgeted pattern; known: {', '.join(PATTERNS)}")
        if not 0 < self.squeeze_factor <= 1:
            raise SolverError(f"squeeze_factor: must be in (0, 1], got {self.squeeze_factor:g}")
        if self.clusters < 2:
            raise SolverError(f"clusters: must be >= 2, got {self.clusters}")


def kmeans_1d(values: np.ndarray, k: int) -> np.ndarray:
    """Exact 1-D k-means: labels 0..k'-1 ordered by increasing center (k' <= k distinct values)."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    distinct = np.unique(x)
    k = min(k, distinct.size)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    c1 = np.concatenate([[0.0], np.cumsum(xs)])
    c2 = np.concatenate([[0.0], np.cumsum(xs * xs)])

    def sse(i: int, j: int) -> float:  # cluster xs[i:j]
        m = j - i
        s = c1[j] - c1[i]
        return float(c2[j] - c2[i] - s * s / m)

    # DP over split points: cost[c][j] = best SSE of xs[:j] in c clusters
    INF = float("inf")
    cost = [[INF] * (n + 1) for _ in range(k + 1)]
    back = [[0] * (n + 1) for _ in range(k + 1)]
    cost[0][0] = 0.0
    for c in range(1, k + 1):
        for j in range(c, n + 1):
            best, arg = INF, c - 1
            for i in range(c - 1, j):
                if cost[c - 1][i] == INF:
                    continue
                v = cost[c - 1][i] + sse(i, j)
                if v < best - 1e-15:
                    best, arg = v, i
            cost[c][j], back[c][j] = best, arg
    labels_sorted = np.empty(n, dtype=np.int64)
    j = n
    for c in range(k, 0, -1):
        i = back[c][j]
        labels_sorted[i:j] = c - 1
        j = i
    labels = np.empty(n, dtype=np.int64)
    labels[order] = labels_sorted
    return labels


class SqueezeSolver(Solver):
    name = "squeeze"
    description = "SqueezeAttention baseline: 3-means on layer cosine, the most redundant group gets p*B"
    needs_table = True
    Settings = SqueezeSettings
    settings: SqueezeSettings

    def _solve(self, problem: Problem) -> Plan:
        table = problem.require_table(self.name)
        s = self.settings
        ref = problem.reference_budget(s.reference_budget)
        g = table.budget_index(ref)
        if s.pattern in table.patterns:
            pidx = [table.pattern_index(s.pattern)]
        else:
            pidx = problem.pattern_indices()
        L, B = problem.num_layers, problem.global_budget
        choices, info = {}, {"reference_budget": ref, "signal_patterns": [table.patterns[i] for i in pidx]}
        for phase in problem.phases:
            f = table.phase_index(phase)
            cos = table._cosine[:, f][:, pidx, g]  # noqa: SLF001
            with np.errstate(invalid="ignore"):
                signal = np.nanmean(np.where(np.isfinite(cos), cos, np.nan), axis=1) if cos.size else cos
            missing = [l for l in range(L) if not np.isfinite(signal[l])]
            if missing:
                raise SolverError(f"signals: cosine at budget {ref} missing for {phase} layers {missing}")
            labels = kmeans_1d(signal, s.clusters)
            n_groups = int(labels.max()) + 1
            targets = np.full(L, B)
            redundant = labels == n_groups - 1  # highest center
            n_red = int(redundant.sum())
            if n_groups > 1 and n_red < L:
                targets[redundant] = s.squeeze_factor * B
                targets[~redundant] = B + (1.0 - s.squeeze_factor) * B * n_red / (L - n_red)
            budgets = allocate(problem.total, base=targets, weights=np.ones(L), lo=problem.b_min, hi=problem.max_budget)
            choices[phase] = [(s.pattern, int(b)) for b in budgets]
            info[phase] = {
                "cosine": signal.tolist(),
                "groups": labels.tolist(),
                "squeezed_layers": np.nonzero(redundant)[0].tolist() if n_groups > 1 else [],
            }
        return Plan(choices, message=f"p={s.squeeze_factor:g}, cosine read at budget {ref}", info=info)
