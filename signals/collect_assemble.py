"""From journal records to the signal table: per-sample values, means and standard errors.

A unit record holds, per cell (pattern-major) and token block, the block means of the per-token
cosine, NLL and KL; a sample's FullKV record holds its NLL block means. Per cell, with
``S`` samples and ``K`` blocks per sample (sizes from :func:`~signals.uncertainty.block_sizes`):

* per-sample values: the token means of the sample (ΔPPL: ``exp(ν_cell,s) − exp(ν_full,s)``);
* table values: cosine and KL are the means over samples; ΔPPL is ``exp(mean_s ν_cell,s) −
  exp(mean_s ν_full,s)`` (the pooled token PPL, samples having equal lengths);
* standard errors over the ``S·K`` (sample, block) units (:func:`~signals.uncertainty.ratio_mean_se`);
  ΔPPL's from the paired NLL differences by the delta method; ``se_dof = S·K − 1``.

A ΔPPL whose ``exp`` overflows is stored as missing and listed in ``overflowed`` (the caller puts it
in the provenance): the table holds finite values only.
"""

from __future__ import annotations

import numpy as np

from signals.collect_settings import CollectSettings
from signals.journal import Journal
from signals.replay import TokenSignals
from signals.table import SignalTable
from signals.uncertainty import block_means, block_sizes, ratio_mean_se


def unit_record(unit, tokens: TokenSignals, sizes: np.ndarray, seconds: float) -> dict:
    """The journal record of one unit from its cells' per-token signals."""
    return {
        "kind": "unit",
        "sample": unit.sample,
        "layer": unit.layer,
        "phase": unit.phase,
        "cosine": block_means(tokens.cosine, sizes).tolist(),
        "nll": block_means(tokens.nll, sizes).tolist(),
        "kl": block_means(tokens.kl, sizes).tolist(),
        "seconds": seconds,
    }


def assemble(jr: Journal, n_samples: int, m: int, settings: CollectSettings, num_layers: int) -> tuple[SignalTable, list]:
    """The table of every finished cell, and the cells whose ΔPPL overflowed."""
    table = SignalTable.empty(num_layers, settings.phases, settings.patterns, settings.budgets)
    S = n_samples
    sizes = block_sizes(m, settings.blocks)
    K = len(sizes)
    weights = sizes / sizes.sum()
    overflowed: list = []
    if len(jr.full) < S:
        return table, overflowed
    full_blocks = np.array([jr.full[s]["nll_blocks"] for s in range(S)], dtype=np.float64)  # [S, K]
    full_s = full_blocks @ weights  # [S]
    full_ppl = float(np.exp(full_s.mean()))
    table.set_full_ppl(full_ppl)
    table.set_se_dof(S * K - 1 if S * K > 1 else None)
    for phase in settings.phases:
        for layer in range(num_layers):
            ent = [jr.full[s]["entropy"][phase][layer] for s in range(S)]
            var = [jr.full[s]["variance"][phase][layer] for s in range(S)]
            table.set_layer(layer, phase, entropy=float(np.mean(ent)), variance=float(np.mean(var)))
    unit_sizes = np.tile(sizes, S)
    G = len(settings.budgets)
    for layer in settings.layers:
        for phase in settings.phases:
            recs = [jr.units.get((s, layer, phase)) for s in range(S)]
            if any(r is None for r in recs):
                continue
            blocks = {k: np.array([r[k] for r in recs], dtype=np.float64) for k in ("cosine", "nll", "kl")}  # [S, C, K]
            diff = blocks["nll"] - full_blocks[:, None, :]
            per = {k: blocks[k] @ weights for k in ("cosine", "nll", "kl")}  # [S, C]
            with np.errstate(over="ignore", invalid="ignore"):
                cell_ppl = np.exp(per["nll"].mean(axis=0))  # [C]
                dppl = cell_ppl - full_ppl
                dppl_s = np.exp(per["nll"]) - np.exp(full_s)[:, None]  # [S, C]

                def se(x: np.ndarray) -> np.ndarray:  # [S, C, K] -> [C]
                    return ratio_mean_se(x.transpose(1, 0, 2).reshape(x.shape[1], S * K), unit_sizes)[1]

                se_dppl = cell_ppl * se(diff)
            se_cos, se_kl = se(blocks["cosine"]), se(blocks["kl"])
            for p, pattern in enumerate(settings.patterns):
                for b, budget in enumerate(settings.budgets):
                    i = p * G + b
                    ok = bool(np.isfinite(dppl[i]) and np.isfinite(dppl_s[:, i]).all())
                    if not ok:
                        overflowed.append([layer, phase, pattern, budget])
                    table.set_cell(
                        layer,
                        phase,
                        pattern,
                        budget,
                        cosine=float(per["cosine"][:, i].mean()),
                        dppl=float(dppl[i]) if ok else float("nan"),
                        kl=float(per["kl"][:, i].mean()),
                        se={
                            "cosine": _nan_ok(se_cos[i]),
                            "dppl": _nan_ok(se_dppl[i]) if ok else float("nan"),
                            "kl": _nan_ok(se_kl[i]),
                        },
                        per_sample={
                            "cosine": per["cosine"][:, i].tolist(),
                            "dppl": dppl_s[:, i].tolist() if ok else [float("nan")] * S,
                            "kl": per["kl"][:, i].tolist(),
                        },
                    )
    return table, overflowed


def _nan_ok(x: float) -> float:
    """A standard error to store: finite, or NaN (unknown)."""
    x = float(x)
    return x if np.isfinite(x) else float("nan")
