"""`polykv-search show signals.json [--plot out.png]`: a readable summary of a signal table.

Per phase, a table of every layer: FullKV attention entropy and variance, the best pattern by cosine
(mean over the budget grid), by ΔPPL and by KL (means over the grid), the layer's sensitivity
(worst-case ΔPPL over patterns at the smallest budget) and how many of its cells the calibration
cannot tell from FullKV (their 95 % ΔPPL interval, value ± t·SE, contains 0; tables with standard
errors only); then the most sensitive layers. The header names the calibration's retrieval mix
(evidence samples vs prose samples, records per evidence sample; "prose only" for tables collected
without ``--retrieval-mix`` or before it existed). ``--plot`` draws heatmaps (per phase: mean cosine over
the grid per layer × pattern, ΔPPL of every cell with a dot on the cells indistinguishable from
FullKV) and entropy per layer; with per-head signals, the retrieval scores per layer x KV head and, when
the table has streaming cells, the strongest retrieval heads are followed by the heads whose streaming costs
the most answer KL (printed, and a heatmap at the smallest budget); with prefill cells of scored patterns,
one line per (pattern, budget) and which pattern is cheapest per KV head (:mod:`polykv_search.cli.show_heads`).
"""

from __future__ import annotations

import io
import math

import numpy as np
from rich import box
from rich.markup import escape
from rich.table import Table

from polykv_search.cli.common import CLIError, out
from polykv_search.cli.show_heads import TOP_SENSITIVE, describe_cells, describe_heads

__all__ = ["TOP_SENSITIVE", "describe_cells", "describe_heads", "show_signals", "write_plot"]


def _nanmean(a: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        count = np.sum(np.isfinite(a), axis=axis)
        total = np.nansum(np.where(np.isfinite(a), a, np.nan), axis=axis)
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _fmt(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


LEVEL = 0.95


def summarize(table) -> dict:
    """The numbers ``show`` prints: per phase, per layer best patterns, sensitivity and the count of
    cells indistinguishable from FullKV (None without standard errors)."""
    cos, dppl, kl = table.cosine_array(), table.dppl_array(), table.kl_array()
    same = table.indistinguishable("dppl", LEVEL) if table.has_uncertainty else None
    result = {}
    for f, phase in enumerate(table.phases):
        mean_cos = _nanmean(cos[:, f], axis=-1)  # (L, P)
        mean_dppl = _nanmean(dppl[:, f], axis=-1)
        mean_kl = _nanmean(kl[:, f], axis=-1)
        smallest = dppl[:, f, :, 0]  # (L, P)
        rows = []
        for layer in range(table.num_layers):
            row = {"layer": layer}
            c, d = mean_cos[layer], mean_dppl[layer]
            if np.isfinite(c).any():
                i = int(np.nanargmax(np.where(np.isfinite(c), c, -np.inf)))
                row["best_cosine"] = (table.patterns[i], float(c[i]))
            if np.isfinite(d).any():
                i = int(np.nanargmin(np.where(np.isfinite(d), d, np.inf)))
                row["best_dppl"] = (table.patterns[i], float(d[i]))
            k = mean_kl[layer]
            if np.isfinite(k).any():
                i = int(np.nanargmin(np.where(np.isfinite(k), k, np.inf)))
                row["best_kl"] = (table.patterns[i], float(k[i]))
            if same is not None:
                known = np.isfinite(table.se_array("dppl")[layer, f]) & np.isfinite(dppl[layer, f])
                row["indistinguishable"] = (int(same[layer, f].sum()), int(known.sum()))
            s = smallest[layer]
            row["sensitivity"] = float(np.max(s[np.isfinite(s)])) if np.isfinite(s).any() else math.nan
            rows.append(row)
        result[phase] = rows
    return result


def describe_retrieval(record: dict | None, n_samples: int | None = None) -> list[str]:
    """The calibration's retrieval mix as lines of at most 80 characters.

    Parameters
    ----------
    record : dict or None
        A table's provenance ``retrieval`` record (:attr:`SignalTable.retrieval`, written by
        ``collect``); None or a record without evidence samples reads as prose only.
    n_samples : int, optional
        The table's sample count, for records that do not state it.

    Returns
    -------
    list of str
        ``["retrieval mix: prose only (8 samples)"]``, or a first line with the mix and the
        counts and a second with the records per evidence sample, their kinds and what is scored.
    """
    record = record if isinstance(record, dict) else {}
    evidence = _count(record.get("evidence_samples"))
    prose = _count(record.get("prose_samples"))
    total = evidence + prose if evidence is not None and prose is not None else n_samples
    n = "?" if total is None else str(total)
    if not evidence:
        return [f"retrieval mix: prose only ({n} samples)"]
    records = record.get("records_per_sample", "?")
    head = f"retrieval mix {record.get('mix') or '?'}: {evidence} of {n} samples with evidence, "
    head += f"{'?' if prose is None else prose} prose;"
    kinds = record.get("kinds") if isinstance(record.get("kinds"), dict) else {}
    kinds = ", ".join(f"{k} {v}" for k, v in kinds.items() if v)
    tail = "scored on their answer tokens only"
    line = f"  {records} records each (kinds {kinds}); {tail}" if kinds else ""
    return [head, line if 0 < len(line) <= 80 else f"  {records} records each; {tail}"]


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _best_names(row: dict, keys: list[str]) -> str:
    """The best patterns by each metric, ``a / b / c``; once when they all agree."""
    names = [escape(row[k][0]) if row.get(k) else "-" for k in keys]  # kvzip[allocation=model] is not markup
    return names[0] if len(set(names)) == 1 else " / ".join(names)


def _layer_table(table, f: int, rows: list[dict], ent: np.ndarray, var: np.ndarray, has_kl: bool) -> Table:
    """One row per layer, laid out for an 80-column terminal: the best pattern by each metric in one
    column (once when they agree), each metric's best value, the sensitivity and the count of cells
    indistinguishable from FullKV."""
    phase, b0 = table.phases[f], table.budgets[0]
    metrics = [("best_kl", "KL", ".4f")] if has_kl else []
    metrics += [("best_dppl", "dPPL", "+.3f"), ("best_cosine", "cos", ".4f")]
    t = Table(
        title=f"{phase}: best pattern per layer by {'/'.join(m[1] for m in metrics)} (means over budgets)",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        pad_edge=False,
    )
    t.add_column("layer", justify="right", no_wrap=True)
    t.add_column("entropy", justify="right", no_wrap=True)
    t.add_column("var", justify="right", no_wrap=True)
    t.add_column(f"best ({'/'.join(m[1] for m in metrics)})", overflow="fold", min_width=18)
    for _, name, _ in metrics:
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("worst", justify="right", no_wrap=True)
    if table.has_uncertainty:
        t.add_column("≈Full", justify="right", no_wrap=True)
    t.caption = f"worst: the layer's worst dPPL over patterns at budget {b0}" + (
        "; ≈Full: its cells indistinguishable from FullKV" if table.has_uncertainty else ""
    )
    for row in rows:
        layer = row["layer"]
        cells = [str(layer), _fmt(ent[layer, f]), _fmt(var[layer, f], ".4f"), _best_names(row, [m[0] for m in metrics])]
        cells += [_fmt(row[key][1], spec) if row.get(key) else "-" for key, _, spec in metrics]
        cells.append(_fmt(row["sensitivity"], "+.3f"))
        if "indistinguishable" in row:
            cells.append("{}/{}".format(*row["indistinguishable"]))
        t.add_row(*cells)
    return t


def show_signals(path: str, plot: str | None = None) -> int:
    from signals import SignalTable

    table = SignalTable.load(path)
    prov = table.provenance
    L, F, P, G = table.shape
    done = L * F * P * G - len(table.missing_cells())
    calib = prov.get("calibration", {}) if isinstance(prov.get("calibration"), dict) else {}
    out.print(
        f"[bold]{path}[/bold]: model {prov.get('model', '?')}, {prov.get('n_samples', '?')} samples of "
        f"{prov.get('context_len', '?')}+{prov.get('continuation_len', '?')} tokens from {calib.get('spec', '?')} "
        f"(fingerprint {calib.get('fingerprint', '?')}), method {prov.get('method', '?')}",
        highlight=False,
    )
    for line in describe_retrieval(table.retrieval, table.n_samples):
        out.print(line, highlight=False, markup=False)
    out.print(
        f"grid: {L} layers x {F} phases x {P} patterns x {G} budgets {list(table.budgets)}; "
        f"{done}/{L * F * P * G} cells collected; FullKV PPL {_fmt(table.full_ppl)}",
        highlight=False,
    )
    if table.heads is not None and F * P * G == 1 and done <= 1:  # a head-level table's one placeholder cell
        out.print(
            "layer grid: one placeholder cell, as a head-level collect writes it (no layer-level signals: "
            "`solve --granularity head` reads the head-level signals below)",
            highlight=False,
        )
    else:
        _show_layers(table)
    for line in describe_heads(table.heads):
        out.print(line, highlight=False, markup=False)
    if plot:
        write_plot(table, plot)
        out.print(f"wrote {plot}", highlight=False)
    return 0


def _show_layers(table) -> None:
    """The per-layer tables and lines of each phase."""
    summary = summarize(table)
    has_kl = "kl" in table.signals
    if not table.has_uncertainty:
        out.print(
            "no standard errors in this table (version 1 or a single sample-block unit): cells cannot be compared "
            "with FullKV; recollect it with polykv-search collect",
            highlight=False,
        )
    ent, var = table.entropy_array(), table.variance_array()
    b0 = table.budgets[0]
    for f, phase in enumerate(table.phases):
        out.print(_layer_table(table, f, summary[phase], ent, var, has_kl))
        if table.has_uncertainty:
            counts = [r["indistinguishable"] for r in summary[phase] if "indistinguishable" in r]
            n_same, n_known = sum(c[0] for c in counts), sum(c[1] for c in counts)
            out.print(
                f"{phase}: {n_same} of {n_known} cells are indistinguishable from FullKV "
                f"(their {LEVEL:.0%} dPPL interval, "
                f"value ± t·SE with {table.se_dof} degrees of freedom, contains 0)",
                highlight=False,
            )
        sens = [(r["sensitivity"], r["layer"]) for r in summary[phase] if math.isfinite(r["sensitivity"])]
        if sens:
            top = sorted(sens, reverse=True)[:TOP_SENSITIVE]
            out.print(
                f"{phase}: most sensitive layers (worst-case dPPL over patterns at budget {b0}): "
                + ", ".join(f"{l} ({s:+.3f})" for s, l in top),
                highlight=False,
            )
        e = ent[:, f]
        if np.isfinite(e).any():
            lo, hi = int(np.nanargmin(e)), int(np.nanargmax(e))
            out.print(
                f"{phase}: entropy mean {np.nanmean(e):.3f}, "
                f"lowest layer {lo} ({e[lo]:.3f}), highest layer {hi} ({e[hi]:.3f})",
                highlight=False,
            )
        counts: dict[str, int] = {}
        for row in summary[phase]:
            if row.get("best_cosine"):
                counts[row["best_cosine"][0]] = counts.get(row["best_cosine"][0], 0) + 1
        if counts:
            out.print(
                f"{phase}: layers won by cosine: "
                + ", ".join(f"{escape(p)} {n}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1])),
                highlight=False,
            )


def write_plot(table, path: str) -> None:
    """Heatmaps per phase (mean cosine per layer × pattern; ΔPPL of every cell, dots where it is
    indistinguishable from FullKV) and entropy per layer, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from polykv_search.io import atomic_write_bytes

    L, F, P, G = table.shape
    cos, dppl, ent = table.cosine_array(), table.dppl_array(), table.entropy_array()
    same = table.indistinguishable("dppl", LEVEL) if table.has_uncertainty else None
    height = max(4.0, 0.22 * L + 1.5)
    heads = table.heads
    panels = 0 if heads is None else 1 + (heads.cells is not None)
    ncols = 2 * F + 1 + panels
    width = 3.2 * F + 0.12 * P * G * F + 4.0 + 2.5 * panels
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    axes = axes[0]
    finite = dppl[np.isfinite(dppl)]
    lim = float(np.percentile(np.abs(finite), 95)) if finite.size else 1.0
    lim = lim if lim > 0 else 1.0
    for f, phase in enumerate(table.phases):
        ax = axes[2 * f]
        im = ax.imshow(
            np.ma.masked_invalid(_nanmean(cos[:, f], -1)), aspect="auto", cmap="viridis", interpolation="nearest"
        )
        ax.set_title(f"{phase}: cosine\n(mean over budgets)", fontsize=9)
        ax.set_xticks(range(P))
        ax.set_xticklabels(table.patterns, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("layer")
        ax.set_yticks(range(0, L, max(1, L // 15)))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        # every cell: columns pattern-major, one per (pattern, budget)
        ax = axes[2 * f + 1]
        cells = dppl[:, f].reshape(L, P * G)
        im = ax.imshow(
            np.ma.masked_invalid(cells), aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest"
        )
        if same is not None:
            ys, xs = np.nonzero(same[:, f].reshape(L, P * G))
            ax.scatter(xs, ys, s=6, c="black", marker="o", label=f"{LEVEL:.0%} interval contains 0")
            ax.legend(fontsize=6, loc="lower right", framealpha=0.8)
        title = "dPPL per cell" + (
            "\n(dots: indistinguishable from FullKV)" if same is not None else "\n(no standard errors)"
        )
        ax.set_title(f"{phase}: {title}", fontsize=9)
        ax.set_xticks([p * G + (G - 1) / 2 for p in range(P)])
        ax.set_xticklabels(table.patterns, rotation=60, ha="right", fontsize=7)
        for p in range(1, P):
            ax.axvline(p * G - 0.5, color="white", linewidth=1)
        ax.set_yticks(range(0, L, max(1, L // 15)))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax = axes[2 * F]
    layers = np.arange(L)
    for f, phase in enumerate(table.phases):
        ax.plot(ent[:, f], layers, marker="o", markersize=3, label=phase)
    ax.invert_yaxis()
    ax.set_title("FullKV attention entropy\n(normalized)", fontsize=9)
    ax.set_xlabel("entropy")
    ax.set_ylabel("layer")
    ax.legend(fontsize=7)
    if heads is not None:
        ax = axes[2 * F + 1]
        im = ax.imshow(heads.retrieval.mean, aspect="auto", cmap="magma", vmin=0, interpolation="nearest")
        ax.set_title(f"retrieval score per KV head\n({heads.retrieval.n_samples} samples)", fontsize=9)
        ax.set_xlabel("KV head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(heads.num_kv_heads))
        ax.set_yticks(range(0, L, max(1, L // 15)))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if heads is not None and heads.cells is not None:
        from matplotlib.colors import LogNorm

        cells, ax = heads.cells, axes[2 * F + 2]
        kl = cells.kl_answer_mean[:, :, 0]
        top = max(float(kl.max()), 1e-9)  # log scale: one head's cost can dwarf the rest
        norm = LogNorm(vmin=max(top * 1e-4, float(kl[kl > 0].min()) if (kl > 0).any() else top * 1e-4), vmax=top)
        im = ax.imshow(np.maximum(kl, norm.vmin), aspect="auto", cmap="magma", norm=norm, interpolation="nearest")
        ax.set_title(f"answer KL (log), only this KV\nhead streams at b={cells.budgets[0]}", fontsize=9)
        ax.set_xlabel("KV head")
        ax.set_xticks(range(heads.num_kv_heads))
        ax.set_yticks(range(0, L, max(1, L // 15)))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"signals: {table.provenance.get('model', '?')}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as err:
        raise CLIError(f"cannot write {path}: {err.strerror or err}") from None
