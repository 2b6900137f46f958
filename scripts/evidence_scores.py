"""Which prompt score would keep a recall sample's facts? Candidate evidence scores ranked on calibration samples.

For ``decode/recall`` samples drawn from the calibration split, one FullKV prompt call (eager attention, all
attention maps and logits) gives, per layer and KV head, several candidate scores of every prompt token; the
script reports how many of the asked number's tokens each score puts among a head's best ``--top`` tokens
(the evidence share at B = 128 is 64), averaged over heads and samples, and in how many heads the whole number
is there. Diagnosis only: no pattern is built from here.

    python scripts/evidence_scores.py --samples 4 --top 64 --out scores.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polykv_search.data import load_corpus, split_corpus  # noqa: E402
from polykv_search.evaluation import get_task  # noqa: E402
from polykv_search.evaluation.base import split_seed  # noqa: E402
from polykv_search.evaluation.samples import encode_prompt  # noqa: E402
from polykv_search.io import write_json  # noqa: E402
from polykv_search.models import load_model  # noqa: E402
from scripts.recall_diagnosis import fact_spans  # noqa: E402


def pool(x: torch.Tensor, kernel: int) -> torch.Tensor:
    """Average over ``kernel`` neighbours along the last axis (zero beyond the ends)."""
    shape = x.shape
    flat = x.reshape(-1, 1, shape[-1])
    return torch.nn.functional.avg_pool1d(flat, kernel, 1, kernel // 2, count_include_pad=True).reshape(shape)


def candidate_scores(attn: torch.Tensor, surprisal: torch.Tensor, groups: int, window: int) -> dict[str, torch.Tensor]:
    """``attn`` ``[Hq, n, n]`` of one layer; returns ``{name: [Hkv, n]}``."""
    hq, n, _ = attn.shape
    a = attn.float()
    idx = torch.arange(n)
    out = {}
    last = a[:, n - window :, :].sum(1)
    last[:, n - window :] = 0
    out["snapkv_last_window"] = pool(last, 5)
    seen_by = (n - idx).clamp(min=1).float()
    out["mean_over_all_queries"] = pool(a.sum(1) / seen_by, 5)
    far = (idx[:, None] - idx[None, :]) >= 64  # query i, key j: at least 64 tokens back
    out["max_long_range"] = pool(a.masked_fill(~far, 0).amax(1), 5)
    h = hq // groups
    out = {k: v.view(h, groups, n).mean(1) for k, v in out.items()}
    out["surprisal"] = pool(surprisal[None].expand(h, n), 5)
    out["surprisal_max3"] = torch.nn.functional.max_pool1d(surprisal[None, None], 3, 1, 1)[0].expand(h, n)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--context-len", type=int, default=512)
    p.add_argument("--top", type=int, default=64)
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", default="decode/recall")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    model, tok = load_model(attn_implementation="eager")
    cfg = model.config
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    texts = [d.text for d in split_corpus(load_corpus("austen"), "calib")]
    task = get_task(args.task, generate_len=16)
    samples = task.generate(tok, texts, args.samples, args.context_len, split_seed(args.seed, "calib"))
    totals: dict[str, list[float]] = {}
    whole: dict[str, int] = {}
    heads = 0
    for sample in samples:
        ids, _ = encode_prompt(tok, sample, None)
        spans = fact_spans(tok, ids, sample.meta["facts"], sample.meta["asked"], sample.answers[0])
        value = torch.tensor(spans["value"])
        with torch.inference_mode():
            out = model(torch.tensor([ids]), output_attentions=True)
        logp = torch.log_softmax(out.logits[0].float(), -1)
        surprisal = torch.zeros(len(ids))
        surprisal[1:] = -logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        for attn in out.attentions:
            for name, score in candidate_scores(attn[0], surprisal, groups, 32).items():
                score = score.clone()
                score[:, : args.sinks] = float("-inf")  # the sinks are kept anyway, outside the share
                top = score.topk(args.top, dim=-1).indices  # [Hkv, top]
                for h in range(top.shape[0]):
                    kept = torch.isin(value, top[h])
                    totals.setdefault(name, []).append(float(kept.float().mean()))
                    whole[name] = whole.get(name, 0) + int(kept.all())
        heads += len(out.attentions) * cfg.num_key_value_heads
        print(sample.id, "done", flush=True)
    summary = {
        name: {"value_tokens_in_top": sum(v) / len(v), "heads_with_whole_value": whole[name], "heads": heads}
        for name, v in totals.items()
    }
    for name, s in summary.items():
        print(
            f"{name:24s} value tokens in top {args.top}: {s['value_tokens_in_top']:.3f}; whole number in "
            f"{s['heads_with_whole_value']} of {heads} (layer, KV head, sample) cells"
        )
    write_json(args.out, {"args": vars(args), "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
