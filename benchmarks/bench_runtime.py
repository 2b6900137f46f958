"""Runtime benchmark: prefill overhead, decode speed and KV memory held, side by side in one process.

    python benchmarks/bench_runtime.py [--model smollm2-135m] [--contexts 2048,4096,8192] [--budget 256]
                                       [--pattern snapkv] [--decode-steps 32] [--repeats 2]
                                       [--intervals 1,8,16] [--strategy S.json ...]
                                       [--out bench_runtime.json]

For every context length, on the same model and the same Austen text, these configurations run in
interleaved order (A B C … then … C B A, ``--repeats`` times), so that machine noise hits all of them:

* ``unmodified``: the model's own SDPA path and ``DynamicCache``;
* ``FullKV``: the runtime applying the FullKV strategy (target: >= 0.98x unmodified);
* ``B<budget> k<k> <mode>``: uniform ``--pattern`` at ``--budget`` for each ``--intervals`` value;
  ``within`` holds at most the budget between steps, ``over`` up to ``budget + k - 1``. ``--pattern``
  may name several patterns (``snapkv,keydiff,expected_attention``): each gets its own configurations,
  named ``<pattern> B<budget> k<k> <mode>``, interleaved with the others;
* ``ceiling``: the unmodified model after a prompt of only ``--budget`` tokens: the same weights and a
  budget-sized cache with no eviction work, i.e. the fastest decode any eviction to the budget can
  reach on this machine (its prefill is of ``--budget`` tokens, so its prefill ratio means nothing);
* every ``--strategy`` file by its name (e.g. a head-group strategy beside uniform snapkv), at k = 1.

``--paired-to PATTERN`` (one of ``--pattern``) also gives every other pattern's decode speed and prefill
time over ``PATTERN``'s at the same ``k`` and mode, repeat by repeat: the median of the per-repeat ratios
with a 95 % bootstrap interval (``runtime_pairs.py``), in the table and in the JSON (``paired``).

Each run prefills the prompt (timed: prefill; logits of the last token only, as ``generate`` does),
then greedy-decodes ``--decode-steps`` tokens (timed:
decode tokens/s), then records the KV bytes held and the peak held since the prompt. Ratios are
medians over the repeats, each against the unmodified model of the same context.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from runtime_pairs import config_name, modes, paired, pairs, text

from polykv_search.data import load_corpus, split_corpus
from polykv_search.io import write_json
from polykv_search.models import DEFAULT_MODEL, load_model
from polykv_search.patterns import canonical_spec, pattern_spec, split_specs
from polykv_search.runtime import apply_strategy
from strategies import Strategy


def prompt_ids(tokenizer, n: int) -> torch.Tensor:
    text = "\n\n".join(doc.text for doc in split_corpus(load_corpus("austen"), "eval"))
    ids = tokenizer(text[: n * 8], add_special_tokens=False).input_ids[:n]
    if len(ids) < n:
        raise SystemExit(f"not enough text for {n} tokens")
    return torch.tensor([ids])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(model, ids: torch.Tensor, steps: int, strategy: Strategy | None, interval: int, mode: str) -> dict:
    """Prefill ``ids``, greedy-decode ``steps`` tokens; seconds, tokens/s and KV bytes (held, peak)."""

    def run(report):
        _sync(ids.device)
        t0 = time.perf_counter()
        out = model(ids, use_cache=True, logits_to_keep=1)  # as generate() does
        _sync(ids.device)
        prefill = time.perf_counter() - t0
        cache, token = out.cache, out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        _sync(ids.device)
        return {"prefill_s": prefill, "decode_tok_s": steps / (time.perf_counter() - t0), **report(cache)}

    if strategy is None:

        def plain(cache):
            held = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers)
            return {"kv_bytes": held, "peak_kv_bytes": held}

        return run(plain)
    with apply_strategy(model, strategy, decode_interval=interval, interval_mode=mode) as rt:
        return run(
            lambda cache: {"kv_bytes": rt.report(cache).kv_bytes, "peak_kv_bytes": rt.report(cache).peak_kv_bytes}
        )


def configurations(layers: int, patterns: list[str], budget: int, intervals: list[int], strategies=()) -> list[tuple]:
    """(name, strategy, interval, mode) of every measured configuration; with one pattern its
    configurations are named ``B<budget> k<k>``, with several ``<pattern> B<budget> k<k>``; ``strategies``:
    ``(name, Strategy)`` pairs, each at k = 1."""
    configs = [("unmodified", None, 1, "within"), ("FullKV", Strategy.full(layers), 1, "within")]
    # the ceiling: the unmodified model decoding after only a budget-long prompt (the same weights and a
    # budget-sized cache, no eviction work), i.e. the fastest any eviction to the budget can decode
    configs.append((CEILING.format(budget=budget), None, 1, "within"))
    for pattern in patterns:
        name, params = pattern_spec(pattern)  # a spec: kvzip[allocation=model]
        budgeted = Strategy.uniform(layers, name, budget, params=params or None)
        for k in intervals:
            for mode in modes(k):
                configs.append((config_name(pattern, patterns, budget, k, mode), budgeted, k, mode))
    configs += [(name, strategy, 1, "within") for name, strategy in strategies]
    return configs


#: Name of the ceiling configuration (its prefill is of ``budget`` tokens, so its prefill ratio is not one).
CEILING = "ceiling {budget}-tok"


def measure(model, ids, steps: int, configs: list[tuple], repeats: int, on_run, budget: int) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {name: [] for name, *_ in configs}
    run_once(model, ids[:, :256], 2, None, 1, "within")  # warm-up
    for r in range(repeats):
        for name, strategy, k, mode in configs if r % 2 == 0 else configs[::-1]:
            prompt = ids[:, -budget:] if name.startswith("ceiling") else ids
            runs[name].append(run_once(model, prompt, steps, strategy, k, mode))
            on_run()
    return runs


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    base = runs["unmodified"]
    out = {}
    for name, rs in runs.items():
        med = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        med["prefill_ratio"] = statistics.median(r["prefill_s"] / b["prefill_s"] for r, b in zip(rs, base))
        med["decode_speedup"] = statistics.median(r["decode_tok_s"] / b["decode_tok_s"] for r, b in zip(rs, base))
        out[name] = {**med, "runs": rs}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--contexts", default="2048,4096,8192", help="prompt lengths (comma separated)")
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument(
        "--pattern",
        default="snapkv",
        help="patterns or specs to run uniform, comma separated (default snapkv), e.g. snapkv,kvzip[allocation=model]",
    )
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved passes over all configurations")
    ap.add_argument("--intervals", default="1,8,16", help="decode_interval values to measure (comma separated)")
    ap.add_argument("--strategy", nargs="*", default=[], help="strategy files (e.g. head groups), each at k = 1")
    ap.add_argument("--paired-to", metavar="PATTERN", help="pair the other patterns' runs with this one's")
    ap.add_argument("--out", default="bench_runtime.json")
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    intervals = [int(x) for x in args.intervals.split(",")]
    try:
        patterns = [canonical_spec(p) for p in split_specs(args.pattern) if p]
        paired_to = canonical_spec(args.paired_to) if args.paired_to else None
        pairing = pairs(patterns, args.budget, intervals, paired_to) if paired_to else {}
    except ValueError as e:
        ap.error(str(e))
    console = Console()
    torch.set_grad_enabled(False)
    model, tok = load_model(args.model, device=args.device, attn_implementation="sdpa")
    strategies = [(Path(f).stem, Strategy.load(f)) for f in args.strategy]
    configs = configurations(model.config.num_hidden_layers, patterns, args.budget, intervals, strategies)
    results = {}
    with console.status("") as status:
        for ctx in contexts:
            ids = prompt_ids(tok, ctx).to(args.device)
            done = [0]

            def on_run(ctx=ctx, done=done):
                done[0] += 1
                status.update(f"context {ctx}: run {done[0]}/{len(configs) * args.repeats}")

            on_run()
            done[0] = 0
            runs = measure(model, ids, args.decode_steps, configs, args.repeats, on_run, args.budget)
            results[str(ctx)] = summarize(runs)
            if pairing:
                results[str(ctx)]["paired"] = paired(runs, pairing)
            write_json(args.out, _document(args, results))
    console.print(_table(args, results))
    if pairing:
        console.print(_paired_table(args, results))
    console.print(f"wrote {args.out}")


def _document(args, results: dict) -> dict:
    return {
        "model": args.model,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "pattern": args.pattern,
        "budget": args.budget,
        "decode_steps": args.decode_steps,
        "repeats": args.repeats,
        "targets": {
            "FullKV": "prefill <= 1.02x, decode >= 0.98x",
            f"B{args.budget} k1": "prefill <= 1.05x, decode >= 1.3x (4k context)",
            "default interval, held <= budget": "decode >= 2x (4k context)",
        },
        "contexts": results,
    }


def _table(args, results: dict) -> Table:
    t = Table(title=f"runtime vs unmodified ({args.model}, {args.device}, {torch.get_num_threads()} threads)")
    for col in ("context", "runtime", "prefill s", "×", "decode tok/s", "×", "peak KV MiB"):
        t.add_column(col, justify="left" if col in ("context", "runtime") else "right")
    for ctx, rows in results.items():
        rows = {name: r for name, r in rows.items() if name != "paired"}
        for i, (name, r) in enumerate(rows.items()):
            t.add_row(
                ctx if i == 0 else "",
                escape(name),  # kvzip[allocation=model] is not rich markup
                f"{r['prefill_s']:.2f}",
                f"{r['prefill_ratio']:.3f}",
                f"{r['decode_tok_s']:.1f}",
                f"{r['decode_speedup']:.2f}",
                f"{r['peak_kv_bytes'] / 2**20:.1f}",
            )
    return t


def _paired_table(args, results: dict) -> Table:
    t = Table(title=escape(f"over {args.paired_to}, repeat by repeat: median [95 % bootstrap]"))
    for col in ("context", "runtime", "decode tok/s ×", "prefill s ×"):
        t.add_column(col, justify="left" if col in ("context", "runtime") else "right")
    for ctx, rows in results.items():
        for i, (name, r) in enumerate(rows["paired"].items()):
            t.add_row(ctx if i == 0 else "", escape(name), text(r["decode"]), text(r["prefill"]))
    return t


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
