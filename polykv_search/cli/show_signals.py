"""`polykv-search show signals.json [--plot out.png]`: a readable summary of a signal table.

Per phase, a table of every layer: FullKV attention entropy and variance, the best pattern by cosine
(mean over the budget grid) and by ΔPPL (mean over the grid), and the layer's sensitivity (worst-case
ΔPPL over patterns at the smallest budget); then the most sensitive layers. ``--plot`` draws heatmaps
(layers × patterns, per phase: mean cosine and mean ΔPPL over the grid) and entropy per layer.
"""

from __future__ import annotations

import io
import math

import numpy as np
from rich.table import Table

from polykv_search.cli.common import CLIError, out

TOP_SENSITIVE = 5


def _nanmean(a: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        count = np.sum(np.isfinite(a), axis=axis)
        total = np.nansum(np.where(np.isfinite(a), a, np.nan), axis=axis)
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _fmt(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def summarize(table) -> dict:
    """The numbers ``show`` prints: per phase, per layer best patterns and sensitivity."""
    cos, dppl = table.cosine_array(), table.dppl_array()
    result = {}
    for f, phase in enumerate(table.phases):
        mean_cos = _nanmean(cos[:, f], axis=-1)  # (L, P)
        mean_dppl = _nanmean(dppl[:, f], axis=-1)
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
            s = smallest[layer]
            row["sensitivity"] = float(np.max(s[np.isfinite(s)])) if np.isfinite(s).any() else math.nan
            rows.append(row)
        result[phase] = rows
    return result


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
    out.print(
        f"grid: {L} layers x {F} phases x {P} patterns x {G} budgets {list(table.budgets)}; "
        f"{done}/{L * F * P * G} cells collected; FullKV PPL {_fmt(table.full_ppl)}",
        highlight=False,
    )
    summary = summarize(table)
    ent, var = table.entropy_array(), table.variance_array()
    b0 = table.budgets[0]
    for f, phase in enumerate(table.phases):
        t = Table(title=f"{phase}: best pattern per layer (cosine and dPPL: mean over budgets)")
        for col in ("layer", "entropy", "variance", "best by cosine", "cosine", "best by dPPL", "dPPL", f"worst dPPL @{b0}"):
            t.add_column(col, justify="left" if col.startswith("best") else "right")
        for row in summary[phase]:
            l = row["layer"]
            bc, bd = row.get("best_cosine"), row.get("best_dppl")
            t.add_row(
                str(l),
                _fmt(ent[l, f]),
                _fmt(var[l, f], ".4f"),
                bc[0] if bc else "-",
                _fmt(bc[1], ".4f") if bc else "-",
                bd[0] if bd else "-",
                _fmt(bd[1], "+.3f") if bd else "-",
                _fmt(row["sensitivity"], "+.3f"),
            )
        out.print(t)
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
                f"{phase}: entropy mean {np.nanmean(e):.3f}, lowest layer {lo} ({e[lo]:.3f}), highest layer {hi} ({e[hi]:.3f})",
                highlight=False,
            )
        counts: dict[str, int] = {}
        for row in summary[phase]:
            if row.get("best_cosine"):
                counts[row["best_cosine"][0]] = counts.get(row["best_cosine"][0], 0) + 1
        if counts:
            out.print(
                f"{phase}: layers won by cosine: " + ", ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1])),
                highlight=False,
            )
    if plot:
        write_plot(table, plot)
        out.print(f"wrote {plot}", highlight=False)
    return 0


def write_plot(table, path: str) -> None:
    """Heatmaps (layers × patterns per phase: mean cosine, mean ΔPPL) and entropy per layer, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from polykv_search.io import atomic_write_bytes

    L, F, P, G = table.shape
    cos, dppl, ent = table.cosine_array(), table.dppl_array(), table.entropy_array()
    height = max(4.0, 0.22 * L + 1.5)
    fig, axes = plt.subplots(1, 2 * F + 1, figsize=(3.2 * (2 * F) + 3.0, height), squeeze=False)
    axes = axes[0]
    finite = dppl[np.isfinite(dppl)]
    lim = float(np.percentile(np.abs(finite), 95)) if finite.size else 1.0
    lim = lim if lim > 0 else 1.0
    for f, phase in enumerate(table.phases):
        for k, (name, data, cmap, vmin, vmax) in enumerate(
            [
                ("cosine", _nanmean(cos[:, f], -1), "viridis", None, None),
                ("dPPL", _nanmean(dppl[:, f], -1), "RdBu_r", -lim, lim),
            ]
        ):
            ax = axes[2 * f + k]
            im = ax.imshow(np.ma.masked_invalid(data), aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
            ax.set_title(f"{phase}: {name}\n(mean over budgets)", fontsize=9)
            ax.set_xticks(range(P))
            ax.set_xticklabels(table.patterns, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel("layer")
            ax.set_yticks(range(0, L, max(1, L // 15)))
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax = axes[-1]
    layers = np.arange(L)
    for f, phase in enumerate(table.phases):
        ax.plot(ent[:, f], layers, marker="o", markersize=3, label=phase)
    ax.invert_yaxis()
    ax.set_title("FullKV attention entropy\n(normalized)", fontsize=9)
    ax.set_xlabel("entropy")
    ax.set_ylabel("layer")
    ax.legend(fontsize=7)
    fig.suptitle(f"signals: {table.provenance.get('model', '?')}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as err:
        raise CLIError(f"cannot write {path}: {err.strerror or err}") from None
