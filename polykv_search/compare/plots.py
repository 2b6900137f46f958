"""PNG plots of a comparison: per-layer budgets and patterns, score vs budget, suite scores, and the
decode suite's drift (KL per generated-position bucket).

Scores are drawn with error bars: the bootstrap interval of each suite score (asymmetric, from
its low and high bounds) where the results carry per-sample scores.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from polykv_search.compare.model import Comparison, Row, finite, fmt_budget, layers_of, ordered
from polykv_search.compare.summary import describe
from polykv_search.io import atomic_write_bytes
from polykv_search.patterns import PATTERNS


def plot(c: Comparison, path: str | Path, *, dpi: int = 110) -> Path:
    """PNG: (a) per-layer budgets and patterns of every non-uniform strategy, (b) the scores.

    (a) is drawn when some row is neither FullKV nor uniform. (b) is score vs budget when several
    budgets are compared, else a bar chart of suite scores per entry; both with error bars
    (bootstrap intervals) where the results carry per-sample scores. Written atomically.
    """
    import matplotlib  # lazy: heavy, and only --plot needs it

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    layered = [r for r in c.rows if not r.is_full and not r.is_uniform and layers_of(r.strategy)]
    sweep = c.multi_budget
    parts = ["layers"] if layered else []
    parts.append("sweep" if sweep else "bars")  # scores with their intervals, always
    drift = c.bucket_suites
    if drift:  # the decode suite: KL per position bucket, where each plan starts to drift
        parts.append("drift")

    # panel grid for (a): rows = families, columns = budgets (one row when one budget)
    if layered:
        fams = ordered(r.family for r in layered)
        bud = ordered(sorted({r.budget for r in layered}))
        by_budget = len(bud) > 1
        if by_budget:
            grid = {(fams.index(r.family), bud.index(r.budget)): r for r in layered}
            a_rows, a_cols = len(fams), len(bud)
        else:
            a_cols = min(len(layered), 3)
            a_rows = math.ceil(len(layered) / a_cols)
            grid = {(i // a_cols, i % a_cols): r for i, r in enumerate(layered)}
        n_layers = max(len(layers_of(r.strategy)) for r in layered)
        panel_w = max(4.5, min(9.0, 0.22 * n_layers + 1.5))
    drift_panels = [(s, b) for s in drift for b in ordered(r.budget for r in c.rows if r.budget is not None)]
    heights = {"layers": 3.2 * a_rows if layered else 0, "sweep": 3.6, "bars": 3.8, "drift": 3.6}
    width = max(9.0, panel_w * a_cols if layered else 0, 4.5 * max(1, len(c.suites)), 4.5 * len(drift_panels))
    fig = plt.figure(figsize=(width, sum(heights[p] for p in parts) + 0.6 * len(parts)), layout="constrained")
    subfigs = fig.subfigures(len(parts), 1, height_ratios=[heights[p] for p in parts])
    subfigs = list(subfigs) if len(parts) > 1 else [subfigs]  # each part titles its own subfigure
    fig.suptitle(describe(c), fontsize=11)
    for part, sub in zip(parts, subfigs):
        if part == "layers":
            _plot_layers(sub, c, grid, a_rows, a_cols, Patch, by_budget)
        elif part == "sweep":
            _plot_sweep(sub, c)
        elif part == "drift":
            _plot_drift(sub, c, drift_panels)
        else:
            _plot_bars(sub, c, "(b) " if layered else "")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def pattern_colors() -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {p: cmap(i % 10) for i, p in enumerate(PATTERNS)}


def _segments(choice: dict[str, Any]) -> list[tuple[str, float]]:
    """(pattern, tokens per KV head) of one layer and phase: one segment, or each head group's share of
    the layer's mean budget (its budget times its heads, over the layer's heads)."""
    groups = choice.get("head_groups")
    if not groups:
        return [(choice["pattern"], choice["budget"] or 0)]
    n_heads = sum(len(g["heads"]) for g in groups)
    return [(g["pattern"], (g["budget"] or 0) * len(g["heads"]) / n_heads) for g in groups]


def _plot_layers(sub, c: Comparison, grid, n_rows: int, n_cols: int, Patch, by_budget: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    colors = pattern_colors()
    extra = iter(["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"])
    # one budget: every panel on the same scale; a budgets grid: same scale down each budget column
    axes = sub.subplots(n_rows, n_cols, squeeze=False, sharey="col" if by_budget else True)
    used: list[str] = []
    for (i, j), ax in [((i, j), axes[i][j]) for i in range(n_rows) for j in range(n_cols)]:
        row = grid.get((i, j))
        if row is None:
            ax.set_visible(False)
            continue
        layers = layers_of(row.strategy)
        for offset, phase, hatch in ((-0.21, "prefill", None), (0.21, "decoding", "////")):
            for k, layer in enumerate(layers):  # a head-group layer stacks its groups' shares of the mean
                bottom = 0.0
                for p, height in _segments(layer[phase]):
                    if p not in colors:
                        colors[p] = next(extra, "#333333")
                    if p not in used:
                        used.append(p)
                    color = colors[p]
                    style = {"color": _pale(color), "hatch": hatch, "edgecolor": color} if hatch else {"color": color}
                    ax.bar(k + offset, height, width=0.4, bottom=bottom, linewidth=0.0, **style)
                    bottom += height
        if row.budget is not None:
            ax.axhline(row.budget, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{row.name}  (B={fmt_budget(row.budget)})", fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        if j == 0:
            ax.set_ylabel("tokens kept / KV head", fontsize=8)
        ax.tick_params(labelsize=7, labelleft=True)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(-0.7, len(layers) - 0.3)
        ax.margins(y=0.05)
    handles = [Patch(facecolor=colors[p], label=p) for p in used]
    handles += [
        Patch(facecolor="dimgray", label="prefill (left bar)"),
        Patch(
            facecolor=_pale("dimgray"),
            hatch="////",
            edgecolor="dimgray",
            linewidth=0.0,
            label="decoding (right bar, hatched)",
        ),
    ]
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8, label="global budget B"))
    sub.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=8, frameon=False)
    sub.suptitle("(a) per-layer budgets and patterns", fontsize=10, x=0.01, ha="left")


def _plot_sweep(sub, c: Comparison) -> None:
    suites = c.suites or ["(none)"]
    axes = sub.subplots(1, len(suites), squeeze=False)[0]
    markers = "osD^v<>Ph*X"
    for ax, suite in zip(axes, suites):
        families = ordered(r.family for r in c.rows if not r.is_full)
        for k, fam in enumerate(families):
            for run in range(len(c.runs)):
                pts = sorted(
                    (
                        r
                        for r in c.rows
                        if r.family == fam and r.run == run and r.budget is not None and finite(r.suites.get(suite))
                    ),
                    key=lambda r: r.budget,
                )
                if not pts:
                    continue
                label = fam if not c.multi_run else f"{fam} [{c.runs[run]['label']}]"
                err = _yerr(pts, suite)
                dodge = 2 ** (0.025 * (k - (len(families) - 1) / 2))  # error bars of one budget side by side
                ax.errorbar(
                    [r.budget * dodge for r in pts],
                    [r.suites[suite] for r in pts],
                    yerr=[[e[0] for e in err], [e[1] for e in err]],
                    marker=markers[k % len(markers)],
                    linestyle="-" if "uniform" not in fam else "--",
                    label=label,
                    linewidth=1.3,
                    markersize=5,
                    capsize=3,
                    elinewidth=0.9,
                )
        for r in c.rows:
            if r.is_full and finite(r.suites.get(suite)):
                label = "FullKV" if not c.multi_run else f"FullKV [{c.runs[r.run]['label']}]"
                line = ax.axhline(r.suites[suite], color="black", linestyle=":", linewidth=1.2, label=label)
                iv = r.suite_iv.get(suite)
                if iv is not None and iv.bounded:
                    ax.axhspan(iv.low, iv.high, color=line.get_color(), alpha=0.08, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(c.budgets, [f"{b:g}" for b in c.budgets])
        ax.minorticks_off()
        ax.set_xlabel("global budget B (tokens / layer)", fontsize=8)
        ax.set_ylabel(f"{suite} score", fontsize=8)
        ax.set_title(suite, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    sub.legend(uniq.values(), uniq.keys(), loc="outside right center", fontsize=8, frameon=False)
    sub.suptitle("(b) score vs budget", fontsize=10, x=0.01, ha="left")


def _plot_bars(sub, c: Comparison, prefix: str = "") -> None:
    suites = c.suites or []
    ax = sub.subplots()
    names = [r.name if not c.multi_budget else f"{r.name} B={fmt_budget(r.budget)}" for r in c.rows]
    width = 0.8 / max(1, len(suites))
    for k, suite in enumerate(suites):
        vals = [r.suites.get(suite) if finite(r.suites.get(suite)) else 0.0 for r in c.rows]
        err = _yerr(c.rows, suite)
        ax.bar(
            [i + (k - (len(suites) - 1) / 2) * width for i in range(len(c.rows))],
            vals,
            width=width,
            label=suite,
            yerr=[[e[0] for e in err], [e[1] for e in err]],
            capsize=2,
            error_kw={"elinewidth": 0.8},
        )
    ax.set_xticks(range(len(c.rows)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("score", fontsize=8)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    title = "suite scores" + (
        f" with {100 * c.statistics.get('level', 0.95):.0f}% bootstrap intervals" if c.has_intervals else ""
    )
    sub.suptitle(prefix + title, fontsize=10, x=0.01, ha="left")


def _plot_drift(sub, c: Comparison, panels: list[tuple[str, float]]) -> None:
    """KL(FullKV ‖ entry) per position bucket with its interval: one panel per (suite, budget), one line
    per entry (FullKV is 0 everywhere and left out); log scale when every value is positive."""
    axes = sub.subplots(1, max(1, len(panels)), squeeze=False)[0]
    markers = "osD^v<>Ph*X"
    for ax, (suite, budget) in zip(axes, panels):
        names = c.bucket_suites[suite]
        rows = [r for r in c.rows if r.budget == budget and not r.is_full and r.kl_buckets.get(suite)]
        positive = True
        for k, r in enumerate(rows):
            ivs = [r.kl_buckets[suite].get(b) for b in names]
            xs = [i for i, iv in enumerate(ivs) if iv is not None]
            ys = [ivs[i].estimate for i in xs]
            positive = positive and all(y > 0 for y in ys)
            err = [
                (max(0.0, ivs[i].estimate - ivs[i].low), max(0.0, ivs[i].high - ivs[i].estimate))
                if ivs[i].bounded
                else (0.0, 0.0)
                for i in xs
            ]
            dodge = 0.04 * (k - (len(rows) - 1) / 2)
            ax.errorbar(
                [x + dodge for x in xs],
                ys,
                yerr=[[e[0] for e in err], [e[1] for e in err]],
                marker=markers[k % len(markers)],
                linestyle="-" if not r.is_uniform else "--",
                label=r.name,
                linewidth=1.2,
                markersize=4,
                capsize=2,
                elinewidth=0.8,
            )
        if rows and positive:
            ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel("generated-token position bucket", fontsize=8)
        ax.set_ylabel("KL(FullKV ‖ entry), nats/token", fontsize=8)
        ax.set_title(f"{suite}, B={fmt_budget(budget)}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, frameon=False)
    sub.suptitle("drift: KL per position bucket (intervals over samples)", fontsize=10, x=0.01, ha="left")


def _pale(color: Any, amount: float = 0.6) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return tuple(c + (1.0 - c) * amount for c in to_rgb(color))  # type: ignore[return-value]


def _yerr(rows: list[Row], suite: str) -> list[tuple[float, float]]:
    """(below, above) error-bar lengths of each row's suite score; 0 where there is no bounded interval."""
    out = []
    for r in rows:
        iv, s = r.suite_iv.get(suite), r.suites.get(suite)
        if iv is None or not iv.bounded or not finite(s):
            out.append((0.0, 0.0))
        else:
            out.append((max(0.0, s - iv.low), max(0.0, iv.high - s)))
    return out
