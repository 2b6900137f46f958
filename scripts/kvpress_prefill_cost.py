#!/usr/bin/env python
"""kvzip's prefill cost against snapkv's, here and in kvpress, side by side on the same machine.

KVzip's reconstruction pass makes its prefill dearer than a one-pass scorer's. This script measures by
how much in both implementations, so that our figure can be read against the reference one: for each
repeat (interleaved, the order reversed every other repeat) it times, on the same ``--context`` token
ids from the ``austen`` corpus,

* here (the project's Python): the unmodified model, ``uniform-snapkv`` and ``uniform-kvzip`` at
  ``--budget`` (our runtime, the pass included);
* in kvpress (its virtualenv, ``scripts/kvpress_venv.py``; kvpress pins transformers < 5.3): the
  model with no press, ``SnapKVPress`` and ``KVzipPress(layerwise=True)`` at the same compression
  (``1 - budget / context``), the pass included. KVzipPress's ``prefix_length`` is set to 0, as in
  ``scripts/verify_kvpress_patterns.py``: the raw prompt is repeated and scored whole, as ours does.

Every prefill computes the last token's logits only (``logits_to_keep=1``, as ``generate`` does).
Prints per side the median seconds and kvzip's cost over snapkv's (the median of the per-repeat
ratios); ``--json`` keeps every run. Not part of the test run (it installs packages). Usage::

    python scripts/kvpress_prefill_cost.py --model ~/.cache/polykv-search/models/smollm2-135m-* \\
        --context 4096 --budget 256 --repeats 3 --json cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from kvpress_venv import DEFAULT_KVPRESS, DEFAULT_TORCH, DEFAULT_VENV, ensure_venv, run_in_venv  # noqa: E402
from verify_kvpress_patterns import prompts_from_corpus  # noqa: E402

#: what each side runs, in this order on even repeats (reversed on odd ones)
RUNS = ("unmodified", "snapkv", "kvzip")

CHILD = r"""
import json, logging, sys, time
import torch
import transformers
import kvpress
from transformers import AutoModelForCausalLM, DynamicCache

spec = json.load(open(sys.argv[1]))
transformers.utils.logging.disable_progress_bar()
logging.getLogger("kvpress").setLevel(logging.ERROR)
torch.set_num_threads(spec["threads"])
model = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa", dtype=torch.float32).eval()
ids = torch.tensor([spec["ids"]])
presses = {
    "unmodified": lambda: None,
    "snapkv": lambda: kvpress.SnapKVPress(compression_ratio=spec["ratio"]),
    "kvzip": lambda: kvpress.KVzipPress(compression_ratio=spec["ratio"], layerwise=True),
}
out = {}
with torch.no_grad():
    model(input_ids=ids[:, :64], use_cache=True, logits_to_keep=1)  # warm-up
    for name in spec["order"]:
        press, cache = presses[name](), DynamicCache()
        t0 = time.perf_counter()
        if press is None:
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        else:
            with press(model):
                if hasattr(press, "prefix_length"):
                    press.prefix_length = 0
                model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        out[name] = time.perf_counter() - t0  # the with block's exit runs KVzipPress's pass
json.dump(out, open(spec["out"], "w"))
"""


def ours(model, ids, layers: int, budget: int, order) -> dict[str, float]:
    """Seconds per prefill here, in ``order``."""
    import torch

    from polykv_search.runtime import apply_strategy
    from strategies import Strategy

    out = {}
    with torch.no_grad():
        for name in order:
            t0 = time.perf_counter()
            if name == "unmodified":
                model(ids, use_cache=True, logits_to_keep=1)
            else:
                with apply_strategy(model, Strategy.uniform(layers, name, budget)):
                    model(ids, use_cache=True, logits_to_keep=1)  # the runtime runs kvzip's pass after it
            out[name] = time.perf_counter() - t0
    return out


def summarize(runs: list[dict[str, float]]) -> dict:
    """Median seconds per configuration and the median over repeats of kvzip / snapkv."""
    return {
        **{name: statistics.median(r[name] for r in runs) for name in RUNS},
        "kvzip_over_snapkv": statistics.median(r["kvzip"] / r["snapkv"] for r in runs),
        "runs": runs,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="a local HF checkpoint directory (e.g. smollm2-135m-*)")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens (default %(default)s)")
    ap.add_argument("--budget", type=int, default=256, help="tokens kept per head (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default %(default)s)")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"virtualenv for kvpress (default {DEFAULT_VENV})")
    ap.add_argument("--kvpress", default=DEFAULT_KVPRESS, help="pip requirement for kvpress")
    ap.add_argument("--torch", default=DEFAULT_TORCH, help="pip requirement for torch in the virtualenv")
    ap.add_argument("--json", type=Path, help="also write every run to this JSON file")
    args = ap.parse_args(argv)
    if args.context < 64 or not 0 < args.budget < args.context or args.repeats < 1:
        ap.error("need --context >= 64, 0 < --budget < --context and --repeats >= 1")

    import torch

    from polykv_search.io import write_json
    from polykv_search.models import load_model

    model, tokenizer = load_model(args.model, attn_implementation="sdpa")
    (ids,) = prompts_from_corpus(tokenizer, 1, args.context)
    python = ensure_venv(args.venv, args.kvpress, args.torch)
    work = Path(tempfile.mkdtemp(prefix="polykv-kvpress-prefill-"))
    spec = {
        "model": str(Path(args.model).expanduser()),
        "ids": ids,
        "ratio": 1 - args.budget / args.context,
        "threads": torch.get_num_threads(),
        "out": str(work / "times.json"),
    }
    tensor = torch.tensor([ids])
    layers = model.config.num_hidden_layers
    model(tensor[:, :64], use_cache=True, logits_to_keep=1)  # warm-up
    here, there = [], []
    for r in range(args.repeats):
        order = list(RUNS) if r % 2 == 0 else list(RUNS)[::-1]
        here.append(ours(model, tensor, layers, args.budget, order))
        (work / "spec.json").write_text(json.dumps({**spec, "order": order}))
        if run_in_venv(python, CHILD, work / "prefill_in_kvpress_env.py", str(work / "spec.json")) != 0:
            print("the kvpress side failed")
            return 1
        there.append(json.loads((work / "times.json").read_text()))
        print(f"repeat {r + 1}/{args.repeats}: here {here[-1]}, kvpress {there[-1]}", flush=True)

    result = {
        "model": spec["model"],
        "context": args.context,
        "budget": args.budget,
        "threads": spec["threads"],
        "polykv_search": summarize(here),
        "kvpress": summarize(there),
    }
    print(f"\nprefill of {args.context} tokens, B = {args.budget}, {spec['threads']} threads, median of {args.repeats}")
    print(f"{'side':<14} {'unmodified s':>12} {'snapkv s':>9} {'kvzip s':>8} {'kvzip/snapkv':>13}")
    for side in ("polykv_search", "kvpress"):
        s = result[side]
        cells = f"{s['unmodified']:>12.2f} {s['snapkv']:>9.2f} {s['kvzip']:>8.2f}"
        print(f"{side:<14} {cells} {s['kvzip_over_snapkv']:>12.2f}x")
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
