"""`show`'s lines about a signal table's per-KV-head signals: retrieval scores, streaming cells and the
prefill cells of scored patterns (each line within 80 columns where the names allow).

With prefill cells, one line per (pattern, budget): the median over KV heads of the answer KL and the costliest
head; then, per budget every kind of cells has, how many KV heads each pattern is cheapest for (the sum of
answer and prose KL, ``solve --granularity head``'s default signal, without its noise rule).
"""

from __future__ import annotations

import numpy as np

from strategies.choice import spec_label

TOP_SENSITIVE = 5


def describe_heads(heads, top: int = TOP_SENSITIVE) -> list[str]:
    """What the table's per-head signals say: the strongest retrieval heads with their standard errors."""
    if heads is None:
        return ["retrieval heads: not measured (collect --retrieval-heads N)"]
    r, prov = heads.retrieval, heads.provenance
    lines = [
        f"retrieval heads: {r.n_samples} evidence samples of {prov.get('context_len', '?')}+"
        f"{prov.get('continuation_len', '?')} tokens ({prov.get('records', '?')} statement(s) each), "
        f"{r.mean.shape[0]} layers x {heads.num_kv_heads} KV heads; mean score {float(r.mean.mean()):.3f}"
    ]
    best = ", ".join(f"L{l} kv{h} {s:.2f}±{r.se[l, h]:.2f}" for l, h, s in r.top(top))
    lines.append(f"retrieval heads: strongest (mean ± SE): {best}")
    lines += describe_cells(heads.cells, top) if heads.cells is not None or not heads.prefill_cells else []
    return lines + describe_pattern_cells(heads)


def describe_cells(cells, top: int = TOP_SENSITIVE) -> list[str]:
    """The streaming cells: what was measured and, at the smallest budget, the KV heads whose streaming costs
    the most answer KL (with the prose KL of the same heads)."""
    if cells is None:
        return ["streaming cells: not measured (collect --head-cells)"]
    prov, b = cells.provenance, cells.budgets[0]
    lines = [
        f"streaming cells ({cells.pattern}, {cells.sink} sinks, budgets {','.join(map(str, cells.budgets))}): "
        f"KL(FullKV || only that KV head streams) on {prov.get('evidence_samples', '?')} evidence samples' answers "
        f"and {prov.get('prose_samples', '?')} prose samples"
    ]
    g = cells.budget_index(b)
    worst = ", ".join(
        f"L{l} kv{h} {kl:.3f}±{se:.3f} (prose {cells.kl_prose_mean[l, h, g]:.3f})"
        for l, h, kl, se in cells.costliest(top, b)
    )
    lines.append(f"streaming cells: costliest at b={b} (answer KL mean ± SE): {worst}")
    return lines


def _label(cells) -> str:
    """A kind of cells by its pattern spec (``kvzip[allocation=model]`` is not per-head kvzip)."""
    return spec_label(cells.pattern, getattr(cells, "params", None) or {})


def describe_pattern_cells(heads) -> list[str]:
    """With prefill cells of scored patterns: every kind of cells per (pattern, budget), and which pattern is
    cheapest per KV head at each budget they share (module docstring); nothing without prefill cells."""
    if not heads.prefill_cells:
        return []
    sets = heads.cell_sets
    first = sets[0].provenance
    lines = [
        f"head cells: {', '.join(_label(c) for c in sets)} on {first.get('evidence_samples', '?')} evidence "
        f"+ {first.get('prose_samples', '?')} prose samples;",
        "  answer KL per KV head (median, costliest head); prefill: only the",
        "  prompt is compressed, both: the head also streams while decoding",
    ]
    for c in sets:
        kind = "both" if "decoding" in c.phases else "prefill"
        seconds = c.provenance.get("seconds")
        took = f"  ({seconds:.0f}s)" if isinstance(seconds, (int, float)) else ""
        lines.append(f"  {_label(c)} ({kind}){took}:")
        for g, b in enumerate(c.budgets):
            (l, h, kl, _), *_ = c.costliest(1, b)
            median = float(np.median(c.kl_answer_mean[:, :, g]))
            lines.append(f"    b={b}: median {median:.4f}, max {kl:.3f} at L{l} kv{h}")
    shared = sorted(set.intersection(*(set(c.budgets) for c in sets)))
    if len(sets) > 1 and shared:
        lines.append("head cells: cheapest pattern per KV head (answer + prose KL):")
        for b in shared:
            cost = np.stack(
                [c.kl_answer_mean[..., c.budget_index(b)] + c.kl_prose_mean[..., c.budget_index(b)] for c in sets]
            )
            wins = np.bincount(cost.argmin(axis=0).ravel(), minlength=len(sets))
            lines.append(f"  b={b}: " + ", ".join(f"{_label(c)} {int(w)}" for c, w in zip(sets, wins)))
    return lines
