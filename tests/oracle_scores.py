"""The oracle's slow references of the query-agnostic scorers (KeyDiff, Expected Attention): float64
loops over one row and KV head at a time, sharing no code with ``polykv_search``."""

from __future__ import annotations

import math

import torch


def unit(vec):
    norm = math.sqrt(sum(float(x) ** 2 for x in vec))
    return [float(x) / max(norm, 1e-12) for x in vec]


def keydiff_scores(key, b, h, cands, valid):
    """KeyDiff: minus the cosine of each key to the mean unit key of the real cached tokens."""
    units = {j: unit(key[b, h, j].double()) for j in cands}
    d = key.shape[-1]
    anchor = [sum(units[j][i] for j in valid) / max(len(valid), 1) for i in range(d)]
    a = unit(anchor)
    return {j: -sum(u * x for u, x in zip(units[j], a)) for j in cands}


def rotation(p, rope, d):
    """The RoPE matrix of position ``p`` (pairs ``(i, i + d/2)`` rotated by ``p * freq_i``), float64."""
    freqs, scale = rope
    r = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        c, s = math.cos(p * freqs[i]) * scale, math.sin(p * freqs[i]) * scale
        j = i + d // 2
        r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def query_stats(queries, b, hq, params, rope, ahead):
    """Mean and covariance of row ``b``'s pre-RoPE queries of head ``hq`` past its first ``n_sink`` real
    tokens, rotated by ``ahead`` (the mean RoPE matrix of the next ``n_future_positions`` positions)."""
    d = queries[0][0].shape[-1]
    pre, rank = [], 0
    for qvec, qp, real in queries:
        if not real[b]:
            continue
        if rank >= params["n_sink"]:
            pre.append(torch.linalg.solve(rotation(qp, rope, d), qvec[b, hq]))  # undo the model's RoPE
        rank += 1
    mu = sum(pre) / len(pre) if pre else torch.zeros(d, dtype=torch.float64)
    cov = torch.zeros(d, d, dtype=torch.float64)
    for x in pre:
        cov += torch.outer(x - mu, x - mu) / len(pre)
    return ahead @ mu, (ahead @ cov @ ahead.T if params["use_covariance"] else None)


def expected_attention_scores(key, value, b, h, groups, cands, valid, sinks, stats, params):
    """Expected attention of the rotated query Gaussian of each head of the group, softmax over the
    real non-sink tokens, group mean, times the value norm; sinks and padding score 0."""
    scored = [j for j in valid if j not in sinks]
    d = key.shape[-1]
    total = {j: 0.0 for j in scored}
    for hq in range(h * groups, (h + 1) * groups):
        mu, cov = stats[hq]
        logit = {}
        for j in scored:
            k = key[b, h, j].double()
            logit[j] = float(mu @ k) / math.sqrt(d) + (float(k @ cov @ k) / d / 2 if cov is not None else 0.0)
        top = max(logit.values(), default=0.0)
        z = sum(math.exp(x - top) for x in logit.values())
        for j in scored:
            total[j] += math.exp(logit[j] - top) / z / groups
    score = {j: 0.0 for j in cands}
    for j in scored:
        vnorm = math.sqrt(sum(float(x) ** 2 for x in value[b, h, j]))
        score[j] = (total[j] + params["epsilon"]) * vnorm if params["use_vnorm"] else total[j]
    return score


def kvzip_plus_weights(module, value, b: int, hq: int, groups: int, n_prompt: int) -> torch.Tensor:
    """KVzip+'s output factor, written out: ``||v_i W_o[hq]||`` for the first ``n_prompt`` values of row ``b``
    (``W_o[hq]``: query head ``hq``'s columns of ``o_proj.weight``), float64 ``[n_prompt]``."""
    d = value.shape[-1]
    w = module.o_proj.weight.double()[:, hq * d : (hq + 1) * d]  # [hidden, D]: head hq's block
    return torch.stack([(w @ value[b, hq // groups, i].double()).norm() for i in range(n_prompt)])
