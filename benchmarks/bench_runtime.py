"""Runtime benchmark: prefill overhead, decode speed-up and KV memory, side by side in one run.

    python benchmarks/bench_runtime.py [--model smollm2-135m] [--prefill-len 2048] [--decode-context 4096]
                                       [--budget 256] [--decode-steps 32] [--repeats 3] [--out bench_runtime.json]

Measured on the same model and the same Austen text in one process:

* prefill of a ``--prefill-len`` prompt: the unmodified model (its own SDPA path and DynamicCache)
  vs the runtime applying uniform SnapKV at ``--budget`` (target ratio <= 1.15);
* decode tokens/s after a ``--decode-context`` prompt: unmodified FullKV vs the runtime at
  ``--budget`` (target ratio >= 1.3), and the runtime's FullKV for reference;
* KV bytes held after decoding.

Timings are medians over ``--repeats`` runs after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from polykv_search.data import load_corpus, split_corpus
from polykv_search.io import write_json
from polykv_search.models import DEFAULT_MODEL, load_model
from polykv_search.runtime import apply_strategy
from strategies import Strategy


def prompt_ids(tokenizer, n: int) -> torch.Tensor:
    docs = split_corpus(load_corpus("austen"), "eval")
    ids = tokenizer(docs[0].text[: n * 8], add_special_tokens=False).input_ids[:n]
    if len(ids) < n:
        raise SystemExit(f"not enough text for {n} tokens")
    return torch.tensor([ids])


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


@torch.no_grad()
def decode(model, ids: torch.Tensor, steps: int, strategy: Strategy | None, interval: int = 1):
    """Prefill ``ids`` then greedy-decode ``steps`` tokens; returns (tokens/s, kv bytes, lengths)."""

    def run(cache_report):
        out = model(ids, use_cache=True)
        cache = out.cache
        token = out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        tps = steps / (time.perf_counter() - t0)
        return tps, cache_report(cache)

    if strategy is None:
        def report(cache):
            kv = sum(l.keys.numel() * l.keys.element_size() * 2 for l in cache.layers)
            return kv, [l.keys.shape[-2] for l in cache.layers]

        return run(report)
    with apply_strategy(model, strategy, decode_interval=interval) as rt:
        return run(lambda cache: (rt.report(cache).kv_bytes, rt.report(cache).lengths))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--decode-context", type=int, default=4096)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--pattern", default="snapkv")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--intervals", default="1,8", help="decode_interval values to measure (comma separated)")
    ap.add_argument("--out", default="bench_runtime.json")
    args = ap.parse_args()
    console = Console()
    model, tok = load_model(args.model, device=args.device, attn_implementation="sdpa")
    L = model.config.num_hidden_layers
    budgeted = Strategy.uniform(L, args.pattern, args.budget)
    full = Strategy.full(L)
    dev = torch.device(args.device)
    torch.set_grad_enabled(False)

    ids = prompt_ids(tok, args.prefill_len).to(dev)
    t_plain, _ = timed(lambda: model(ids, use_cache=True), args.repeats)

    def with_runtime():
        with apply_strategy(model, budgeted):
            return model(ids, use_cache=True)

    t_rt, _ = timed(with_runtime, args.repeats)

    ids4 = prompt_ids(tok, args.decode_context).to(dev)
    tps_plain, (kv_plain, _) = decode(model, ids4, args.decode_steps, None)
    tps_full, (kv_full, _) = decode(model, ids4, args.decode_steps, full)
    intervals = [int(x) for x in args.intervals.split(",")]
    by_interval = {k: decode(model, ids4, args.decode_steps, budgeted, k) for k in intervals}
    tps_b, (kv_b, lengths) = by_interval[intervals[0]]

    result = {
        "model": args.model,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "pattern": args.pattern,
        "budget": args.budget,
        "prefill": {
            "tokens": args.prefill_len,
            "unmodified_s": t_plain,
            "runtime_s": t_rt,
            "ratio": t_rt / t_plain,
            "target": "<= 1.15",
        },
        "decode": {
            "context": args.decode_context,
            "steps": args.decode_steps,
            "unmodified_fullkv_tok_s": tps_plain,
            "runtime_fullkv_tok_s": tps_full,
            "runtime_budget_tok_s": tps_b,
            "speedup_vs_unmodified": tps_b / tps_plain,
            "by_decode_interval": {
                str(k): {"tok_s": v[0], "speedup_vs_unmodified": v[0] / tps_plain, "kv_bytes": v[1][0]}
                for k, v in by_interval.items()
            },
            "target": ">= 1.3",
        },
        "kv_bytes": {"unmodified_fullkv": kv_plain, "runtime_fullkv": kv_full, "runtime_budget": kv_b, "lengths": lengths},
    }
    write_json(args.out, result)
    t = Table(title=f"runtime benchmark ({args.model}, {args.device}, {torch.get_num_threads()} threads)")
    for c in ("measure", "unmodified", "runtime", "ratio", "target"):
        t.add_column(c)
    t.add_row(f"prefill {args.prefill_len} tok (s)", f"{t_plain:.2f}", f"{t_rt:.2f} ({args.pattern} B={args.budget})", f"{t_rt / t_plain:.3f}", "<= 1.15")
    t.add_row(
        f"decode @ {args.decode_context} (tok/s)",
        f"{tps_plain:.1f}",
        f"{tps_b:.1f} (B={args.budget}); FullKV {tps_full:.1f}",
        f"{tps_b / tps_plain:.2f}x",
        ">= 1.3x",
    )
    for k, (tps_k, (kv_k, _)) in list(by_interval.items())[1:]:
        t.add_row(f"  decode_interval={k} (tok/s)", "", f"{tps_k:.1f} (B={args.budget})", f"{tps_k / tps_plain:.2f}x", "")
    t.add_row("KV held after decode (MiB)", f"{kv_plain / 2**20:.1f}", f"{kv_b / 2**20:.2f}", f"{kv_b / kv_plain:.3f}", "")
    console.print(t)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
