"""From journal records to the signal table: per-sample values, means and standard errors.

A unit record holds, per cell (pattern-major) and token block, the block means of the per-token
cosine, NLL and KL on the sample's scored continuation tokens; a sample's FullKV record holds its
NLL block means. Per cell, with ``S`` samples (block sizes from :func:`~signals.uncertainty.block_sizes`):

* per-sample values: the means over the sample's scored tokens — every continuation token of a prose
  sample, the answer tokens of an evidence sample (:mod:`polykv_search.data.evidence`) — (ΔPPL:
  ``exp(ν_cell,s) − exp(ν_full,s)``);
* table values: cosine and KL are the means over samples; ΔPPL is ``exp(mean_s ν_cell,s) −
  exp(mean_s ν_full,s)`` (the pooled token PPL when every sample scores m tokens);
* standard errors over the (sample, block) units (:func:`~signals.uncertainty.ratio_mean_se`), each
  sample's scored tokens cut into ``K_s = min(blocks, scored length)`` blocks and weighted so that
  every sample counts equally; ΔPPL's from the paired NLL differences by the delta method;
  ``se_dof = Σ_s K_s − 1`` (``S·K − 1`` for prose samples).

A ΔPPL whose ``exp`` overflows is stored as missing and listed in ``overflowed`` (the caller puts it
in the provenance): the table holds finite values only.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def assemble(
    jr: Journal,
    n_samples: int,
    m: int,
    settings: CollectSettings,
    num_layers: int,
    scored_lengths: Sequence[int] | None = None,
) -> tuple[SignalTable, list]:
    """The table of every finished cell, and the cells whose ΔPPL overflowed.

    ``scored_lengths``: per sample, the number of continuation tokens its records score (default
    ``m`` each; an evidence sample's answer length). Each sample counts equally: its value is the
    mean over its scored tokens, and in the standard errors each (sample, block) unit weighs
    ``block size · m / scored length`` (the block sizes themselves when every sample scores m tokens).
    """
    table = SignalTable.empty(num_layers, settings.phases, settings.patterns, settings.budgets)
    S = n_samples
    lengths = list(scored_lengths) if scored_lengths is not None else [m] * S
    sizes = [block_sizes(n, settings.blocks) for n in lengths]
    weights = [z / z.sum() for z in sizes]  # per sample: block weights of its mean
    unit_sizes = np.concatenate([z * (m / n) for z, n in zip(sizes, lengths)])  # [U], U = sum of blocks
    U = len(unit_sizes)
    overflowed: list = []
    if len(jr.full) < S:
        return table, overflowed
    full_blocks = [np.asarray(jr.full[s]["nll_blocks"], dtype=np.float64) for s in range(S)]  # S x [K_s]
    full_s = np.array([fb @ w for fb, w in zip(full_blocks, weights)])  # [S]
    full_units = np.concatenate(full_blocks)  # [U]
    full_ppl = float(np.exp(full_s.mean()))
    table.set_full_ppl(full_ppl)
    table.set_se_dof(U - 1 if U > 1 else None)
    for phase in settings.phases:
        for layer in range(num_layers):
            ent = [jr.full[s]["entropy"][phase][layer] for s in range(S)]
            var = [jr.full[s]["variance"][phase][layer] for s in range(S)]
            table.set_layer(layer, phase, entropy=float(np.mean(ent)), variance=float(np.mean(var)))
    G = len(settings.budgets)
    for layer in settings.layers:
        for phase in settings.phases:
            recs = [jr.units[(s, layer, phase)] for s in range(S) if (s, layer, phase) in jr.units]
            if len(recs) < S:
                continue
            blocks = {
                k: [np.asarray(r[k], dtype=np.float64) for r in recs] for k in ("cosine", "nll", "kl")
            }  # S x [C, K_s]
            units = {k: np.concatenate(v, axis=1) for k, v in blocks.items()}  # [C, U]
            per = {k: np.stack([b @ w for b, w in zip(v, weights)]) for k, v in blocks.items()}  # [S, C]
            with np.errstate(over="ignore", invalid="ignore"):
                cell_ppl = np.exp(per["nll"].mean(axis=0))  # [C]
                dppl = cell_ppl - full_ppl
                dppl_s = np.exp(per["nll"]) - np.exp(full_s)[:, None]  # [S, C]

                def se(x: np.ndarray) -> np.ndarray:  # [C, U] -> [C]
                    return ratio_mean_se(x, unit_sizes)[1]

                se_dppl = cell_ppl * se(units["nll"] - full_units[None, :])
            se_cos, se_kl = se(units["cosine"]), se(units["kl"])
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
