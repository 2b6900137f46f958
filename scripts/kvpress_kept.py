"""Kept-set comparison for ``scripts/verify_kvpress_patterns.py``: pure Python, no torch, no kvpress.

A kept set is one (layer, KV head)'s sorted kept token positions; a prompt's kept sets are a list
``[layer][head]``. :func:`compare` pairs ours with kvpress's per ratio; :func:`top_b_from_scores` turns
the scores of a press that masks instead of shrinking the cache (KVzipPress keeps its scores in
``score_val`` and drops the lowest over several heads at once) into per-head top-``b`` kept sets, so
that its *scores* can be checked against ours under the same per-head budget.
"""

from __future__ import annotations


def budget_for(n: int, ratio: float) -> int:
    """kvpress's ``compute_n_kept``: the tokens a ScorerPress keeps per head at ``ratio``."""
    return max(1, int(n * (1 - ratio)))


def kvpress_pool_kept(n: int, ratio: float, layers: int, heads: int, layerwise: bool) -> list[int]:
    """The tokens KVzipPress keeps per pool, as it counts them (kvpress 0.5.5, batch 1): with ``layerwise``
    each layer drops ``int(heads * n * ratio)`` of its ``heads * n`` tokens (one entry per layer); without it
    the model drops ``int(layers * heads * n * ratio)`` of all of them (one entry). Not a multiple of ``heads``
    in general, unlike a pool of per-head budgets ``sum_l heads * b``."""
    if layerwise:
        return [heads * n - int(heads * n * ratio)] * layers
    return [layers * heads * n - int(layers * heads * n * ratio)]


def pool_budgets(n: int, ratio: float, layers: int, heads: int, allocation: str) -> list[list[int]]:
    """Per (layer, KV head) budgets whose pools hold exactly KVzipPress's kept count at ``ratio``
    (:func:`kvpress_pool_kept`; ``allocation`` ``"layer"``: its ``layerwise=True``, ``"model"``: its default):
    each pool's count spread over its heads as evenly as whole tokens allow, the first heads one more. A pool
    ranks all its tokens at once, so only the total matters; the spread keeps every head's budget within one
    token of the others."""
    pools = kvpress_pool_kept(n, ratio, layers, heads, layerwise=allocation == "layer")
    cells = heads if allocation == "layer" else layers * heads
    flat = [total // cells + (i < total % cells) for total in pools for i in range(cells)]
    return [flat[l * heads : (l + 1) * heads] for l in range(layers)]


def top_b_from_scores(scores: list[list[list[float]]], budget: int, n_sink: int) -> dict:
    """Per (layer, head), the ``budget`` highest of ``scores`` (``[layer][head][token]``), the first
    ``n_sink`` tokens always kept, ties towards the older token: the rule of our patterns
    (``select_keep``) applied to another implementation's scores. The sinks' scores are raised to the
    head's maximum + 1, as KVzipPress does, and returned that way for :func:`cutoff_gap`.

    Returns ``{"kept": [layer][head] sorted positions, "scores": [layer][head] scores}``."""
    kept, raised = [], []
    for layer in scores:
        kept_heads, raised_heads = [], []
        for head in layer:
            top = max(head, default=0.0) + 1.0
            key = [top if i < n_sink else s for i, s in enumerate(head)]
            order = sorted(range(len(key)), key=lambda i: (-key[i], i))
            kept_heads.append(sorted(order[:budget]))
            raised_heads.append(key)
        kept.append(kept_heads)
        raised.append(raised_heads)
    return {"kept": kept, "scores": raised}


def cutoff_gap(scores: list[float], kept: int, diff: set[int]) -> float:
    """How far the tokens in ``diff`` lie from kvpress's cut-off (its ``kept``-th largest score), at
    most, relative to the head's score range (10th to 90th percentile, so padded sinks do not count).
    Near zero: the sides disagree only on tokens whose scores tie up to float rounding."""
    ordered = sorted(scores, reverse=True)
    tenth = len(ordered) // 10
    spread = (ordered[tenth] - ordered[-tenth - 1]) or 1.0
    cut = ordered[kept - 1]
    return max(abs(scores[i] - cut) for i in diff) / spread


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b| (1 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def compare(mine: dict, theirs: dict, n: int, tie_tol: float) -> list[dict]:
    """Per ratio: identical share, swapped tokens, near-ties and overlap of our kept sets and kvpress's.

    ``mine``: ``{ratio: [per prompt: [layer][head] positions]}``; ``theirs``: ``{ratio: [per prompt:
    {"kept": [layer][head], "scores": [layer][head][token] (optional), "inexact": int (optional)}]}``.
    A differing head is a near-tie when every swapped token's score (kvpress's) lies within ``tie_tol``
    of kvpress's cut-off (:func:`cutoff_gap`); without scores none is. Overlap: ``jaccard_differing``
    is the mean Jaccard index of the differing heads' sets; ``layer_jaccard`` the mean over (prompt,
    layer) of the Jaccard index of the layer's (head, position) pairs, which stays meaningful when
    kvpress gives the heads of a layer different budgets; ``common_share`` the share of our kept
    tokens that kvpress keeps too."""
    table = []
    for ratio, rows in mine.items():
        heads = identical = ties = common = ours_kept = their_kept = 0
        swaps: list[int] = []
        gaps: list[float] = []
        differing_j: list[float] = []
        layer_j: list[float] = []
        layer_means: list[float] = []
        head_sizes: list[int] = []
        for a_layers, b_row in zip(rows, theirs[ratio]):
            scores = b_row.get("scores")
            for l, (a_heads, b_heads) in enumerate(zip(a_layers, b_row["kept"])):
                pairs_a = {(h, x) for h, kept in enumerate(a_heads) for x in kept}
                pairs_b = {(h, x) for h, kept in enumerate(b_heads) for x in kept}
                layer_j.append(jaccard(pairs_a, pairs_b))
                layer_means.append(len(pairs_b) / max(1, len(b_heads)))
                head_sizes += [len(kept) for kept in b_heads]
                for h, (a, b) in enumerate(zip(a_heads, b_heads)):
                    heads += 1
                    a, b = set(a), set(b)
                    common += len(a & b)
                    ours_kept += len(a)
                    their_kept += len(b)
                    diff = a ^ b
                    if not diff:
                        identical += 1
                        continue
                    swaps.append(len(a - b))
                    differing_j.append(jaccard(a, b))
                    if scores is not None:
                        gaps.append(cutoff_gap(scores[l][h], len(b), diff))
                        ties += gaps[-1] <= tie_tol
        table.append(
            {
                "ratio": float(ratio),
                "budget": budget_for(n, float(ratio)),
                "heads": heads,
                "identical": identical,
                "identical_share": identical / heads,
                "differing": len(swaps),
                "near_ties": ties,
                "swapped_mean": sum(swaps) / len(swaps) if swaps else 0.0,
                "swapped_max": max(swaps, default=0),
                "max_cutoff_gap": max(gaps, default=0.0),
                "jaccard_differing": sum(differing_j) / len(differing_j) if differing_j else 1.0,
                "layer_jaccard": sum(layer_j) / len(layer_j) if layer_j else 1.0,
                "common_share": common / ours_kept if ours_kept else 1.0,
                "kept_per_head_ours": ours_kept / heads,
                "kept_per_head_theirs": their_kept / heads,
                "theirs_head_range": [min(head_sizes, default=0), max(head_sizes, default=0)],
                "theirs_layer_mean_range": [min(layer_means, default=0.0), max(layer_means, default=0.0)],
                "inexact_matches": sum(row.get("inexact", 0) for row in theirs[ratio]),
            }
        )
    return table


def kept_share(rows: list, lo: int, hi: int) -> float:
    """The share of the slots ``lo..hi-1`` of every (prompt, layer, head) in ``rows`` (``[prompt][layer][head]``
    kept positions) that are kept."""
    slots = kept = 0
    for layers in rows:
        for heads in layers:
            for positions in heads:
                slots += max(0, hi - lo)
                kept += sum(lo <= x < hi for x in positions)
    return kept / slots if slots else 0.0


def top_b_side(theirs: dict, n: int, n_sink: int) -> dict:
    """kvpress's scores ranked by our rule, per ratio (see :func:`top_b_from_scores`)."""
    return {
        ratio: [top_b_from_scores(row["scores"], budget_for(n, float(ratio)), n_sink) for row in rows]
        for ratio, rows in theirs.items()
    }


def print_table(title: str, table: list[dict]) -> None:
    """One comparison table (:func:`compare`), a row per ratio."""
    print(title)
    print(
        f"{'ratio':>6} {'budget':>6} {'identical':>16} {'near-ties':>9} {'swapped':>13} {'J(diff)':>7} "
        f"{'J(layer)':>8} {'common':>6} {'kept/head':>13} max gap"
    )
    for r in table:
        ident = f"{r['identical']}/{r['heads']} ({100 * r['identical_share']:.1f}%)"
        swapped = f"{r['swapped_mean']:.2f} (max {r['swapped_max']})"
        kept = f"{r['kept_per_head_ours']:.1f}/{r['kept_per_head_theirs']:.1f}"
        print(
            f"{r['ratio']:>6} {r['budget']:>6} {ident:>16} {r['near_ties']:>9} {swapped:>13} "
            f"{r['jaccard_differing']:>7.3f} {r['layer_jaccard']:>8.3f} {100 * r['common_share']:>5.1f}% "
            f"{kept:>13} {r['max_cutoff_gap']:.1e}"
        )
        if r["inexact_matches"]:
            print(f"       ({r['inexact_matches']} head(s) matched kvpress's kept keys only approximately)")
        low, high = r["theirs_head_range"]
        if low != high:
            a, b = r["theirs_layer_mean_range"]
            print(f"       (kvpress's heads keep {low}-{high} tokens; its layers {a:.1f}-{b:.1f} per head on average)")


def verdict(table: list[dict]) -> tuple[bool, str]:
    """Whether every differing head of ``table`` is a near-tie, and the sentence that says so."""
    differing = sum(r["differing"] for r in table)
    ties = sum(r["near_ties"] for r in table)
    if differing == 0:
        return True, "identical kept sets"
    if ties == differing:
        return True, f"{differing} differing head(s), all near-ties (float rounding at the cut-off)"
    return False, f"{differing - ties} differing head(s) are not near-ties"
