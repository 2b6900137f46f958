#!/usr/bin/env python
"""Check polykv-search's query-agnostic patterns against kvpress's presses: the same kept token sets.

For each pattern (``--patterns``, default all in :data:`PRESSES`), each compression ratio
(``--ratios``) and each prompt (``--prompts`` windows of ``--prompt-len`` tokens from the ``austen``
corpus), this script (run with the project's Python):

1. prefills the prompt under ``uniform-<pattern>`` at budget ``b = max(1, int(n * (1 - ratio)))``
   (kvpress's ``compute_n_kept``) and reads every (layer, KV head)'s kept positions;
2. in the kvpress virtualenv (``scripts/kvpress_venv.py``; kvpress pins transformers < 5.3), prefills
   the same token ids under the matching press at that ratio and reads its kept positions, plus the
   press's scores (for presses that have ``score``);
3. prints, per pattern and ratio, the share of (prompt, layer, head) kept sets that are identical, the
   tokens swapped where they differ, and whether each differing head is a near-tie: every swapped
   token's kvpress score lies within ``--tie-tol`` (relative to the head's 10th-90th percentile score
   range) of kvpress's own cut-off score, i.e. the two sides rank tokens the same up to float
   rounding. Exit 0 when every difference is a near-tie, 1 otherwise.

Adding a pattern is one :data:`PRESSES` entry: the press class, its keyword arguments besides
``compression_ratio``, our pattern's parameters, and how kvpress's kept positions are read
(``cache``: the press shrinks the cache, kept keys are matched to the uncompressed prefill's keys;
``masked``: the press keeps the cache and masks ``module.masked_key_indices``, as KVzip and AdaKV do).

Not part of the default test run (it installs packages). Usage::

    python scripts/verify_kvpress_patterns.py --model ~/.cache/polykv-search/models/smollm2-135m-*
    python scripts/verify_kvpress_patterns.py --model PATH --patterns keydiff --ratios 0.5,0.9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from kvpress_venv import DEFAULT_KVPRESS, DEFAULT_TORCH, DEFAULT_VENV, ensure_venv, run_in_venv  # noqa: E402


@dataclass(frozen=True)
class Press:
    """How one of our patterns maps to a kvpress press."""

    press: str  # class name in ``kvpress``
    kwargs: dict = field(default_factory=dict)  # besides compression_ratio
    params: dict = field(default_factory=dict)  # our pattern's parameters
    kept: str = "cache"  # how kvpress's kept positions are read: "cache" or "masked"


PRESSES: dict[str, Press] = {
    "keydiff": Press("KeyDiffPress"),
    "expected_attention": Press("ExpectedAttentionPress"),
}

CHILD = r"""
import importlib.metadata, json, sys
import torch
import transformers
import kvpress
from transformers import AutoModelForCausalLM, DynamicCache

spec = json.load(open(sys.argv[1]))
transformers.utils.logging.disable_progress_bar()
print(f"kvpress {importlib.metadata.version('kvpress')}, transformers {transformers.__version__}, "
      f"torch {torch.__version__}", flush=True)
model = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa", dtype=torch.float32).eval()
layers = model.model.layers


def kept_from_cache(cache, full, ids):
    # each kept key is one of the uncompressed prefill's keys (compression runs after the layer's
    # attention, so every layer's keys are computed exactly as without the press): match them
    out, inexact = [], 0
    for layer, keys in zip(cache.layers, full):
        heads = []
        for h in range(keys.shape[1]):
            kept, whole = layer.keys[0, h], keys[0, h]
            equal = (kept[:, None, :] == whole[None, :, :]).all(-1)
            if not bool((equal.sum(-1) == 1).all()):
                inexact += 1
                equal = torch.cdist(kept, whole).argmin(-1, keepdim=True)
                heads.append(sorted(equal[:, 0].tolist()))
            else:
                heads.append(sorted(equal.float().argmax(-1).tolist()))
        out.append(heads)
    return out, inexact


def kept_from_mask(cache, full, ids):
    out = []
    for i, keys in enumerate(full):
        masked = getattr(layers[i].self_attn, "masked_key_indices", None)
        heads = [set(range(keys.shape[2])) for _ in range(keys.shape[1])]
        if masked is not None:
            for b, h, s in zip(*(t.tolist() for t in masked)):
                if b == 0:
                    heads[h].discard(s)
        out.append([sorted(s) for s in heads])
    return out, 0


READERS = {"cache": kept_from_cache, "masked": kept_from_mask}
result = {}
with torch.no_grad():
    for p, ids in enumerate(spec["prompts"]):
        ids = torch.tensor([ids])
        full_cache = DynamicCache()
        model(input_ids=ids, past_key_values=full_cache, use_cache=True)
        full = [layer.keys.clone() for layer in full_cache.layers]
        for name, entry in spec["patterns"].items():
            for ratio in spec["ratios"]:
                press = getattr(kvpress, entry["press"])(compression_ratio=ratio, **entry["kwargs"])
                scores = {}
                if hasattr(press, "score"):
                    def record(module, *args, _score=press.score, **kw):
                        s = _score(module, *args, **kw)
                        scores[module.layer_idx] = s[0].double().tolist()
                        return s
                    press.score = record
                cache = DynamicCache()
                with press(model):
                    model(input_ids=ids, past_key_values=cache, use_cache=True)
                kept, inexact = READERS[entry["kept"]](cache, full, ids)
                row = {"kept": kept, "inexact": inexact}
                if scores:
                    row["scores"] = [scores[i] for i in range(len(full))]
                result.setdefault(name, {}).setdefault(str(ratio), []).append(row)
                print(f"prompt {p}: {name} ratio {ratio} done", flush=True)
json.dump(result, open(spec["out"], "w"))
"""


def budget_for(n: int, ratio: float) -> int:
    """kvpress's ``compute_n_kept``: the tokens a ScorerPress keeps per head at ``ratio``."""
    return max(1, int(n * (1 - ratio)))


def prompts_from_corpus(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` token ids, spread over the austen corpus."""
    from polykv_search.data import load_corpus

    text = "\n\n".join(doc.text for doc in load_corpus("austen").documents)
    ids = tokenizer(text[: 40 * length * (count + 1)], add_special_tokens=False)["input_ids"]
    if len(ids) < length * count:
        raise SystemExit(f"error: the corpus gives {len(ids)} tokens, fewer than {count} x {length}")
    step = (len(ids) - length) // max(1, count)
    return [ids[i * step : i * step + length] for i in range(count)]


def ours(model, name: str, params: dict, prompts, ratios) -> dict:
    """Our kept positions: {ratio: [per prompt: [layer][head] sorted positions]}."""
    import torch

    from polykv_search.runtime import apply_strategy
    from strategies import Strategy

    layers = model.config.num_hidden_layers
    out = {}
    for ratio in ratios:
        rows = []
        for ids in prompts:
            strategy = Strategy.uniform(layers, name, budget_for(len(ids), ratio), params=params)
            with apply_strategy(model, strategy) as rt, torch.no_grad():
                model(torch.tensor([ids]), use_cache=True)
                cache = rt.last_cache
            heads = range(cache.layers[0].positions.shape[1])
            rows.append([[sorted(layer.positions[0, h].tolist()) for h in heads] for layer in cache.layers])
        out[str(ratio)] = rows
    return out


def compare(mine: dict, theirs: dict, n: int, tie_tol: float) -> list[dict]:
    """Per ratio: identical share, swapped tokens, and how many differing heads are near-ties."""
    table = []
    for ratio, rows in mine.items():
        heads = identical = ties = 0
        swaps: list[int] = []
        gaps: list[float] = []
        for a_layers, b_row in zip(rows, theirs[ratio]):
            for l, (a_heads, b_heads) in enumerate(zip(a_layers, b_row["kept"])):
                for h, (a, b) in enumerate(zip(a_heads, b_heads)):
                    heads += 1
                    diff = set(a) ^ set(b)
                    if not diff:
                        identical += 1
                        continue
                    swaps.append(len(set(a) - set(b)))
                    scores = b_row.get("scores")
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
                "inexact_matches": sum(row["inexact"] for row in theirs[ratio]),
            }
        )
    return table


def cutoff_gap(scores: list[float], kept: int, diff: set[int]) -> float:
    """How far the tokens in ``diff`` lie from kvpress's cut-off (its ``kept``-th largest score), at
    most, relative to the head's score range (10th to 90th percentile, so padded sinks do not count).
    Near zero: the sides disagree only on tokens whose scores tie up to float rounding."""
    ordered = sorted(scores, reverse=True)
    tenth = len(ordered) // 10
    spread = (ordered[tenth] - ordered[-tenth - 1]) or 1.0
    cut = ordered[kept - 1]
    return max(abs(scores[i] - cut) for i in diff) / spread


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="a local HF checkpoint directory (e.g. smollm2-135m-*)")
    ap.add_argument("--patterns", default=",".join(PRESSES), help=f"comma-separated, of: {', '.join(PRESSES)}")
    ap.add_argument("--ratios", default="0.25,0.5,0.75,0.9", help="kvpress compression ratios (default %(default)s)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts (corpus windows) per check (default 2)")
    ap.add_argument("--prompt-len", type=int, default=512, help="tokens per prompt (default 512)")
    ap.add_argument("--tie-tol", type=float, default=1e-4, help="near-tie tolerance, relative (default 1e-4)")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"virtualenv for kvpress (default {DEFAULT_VENV})")
    ap.add_argument("--kvpress", default=DEFAULT_KVPRESS, help="pip requirement for kvpress")
    ap.add_argument("--torch", default=DEFAULT_TORCH, help="pip requirement for torch in the virtualenv")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    ap.add_argument("--workdir", type=Path, help="where the exchange files go (default: a temporary directory)")
    args = ap.parse_args(argv)
    names = [p.strip() for p in args.patterns.split(",") if p.strip()]
    unknown = [p for p in names if p not in PRESSES]
    if unknown or not names:
        ap.error(f"unknown pattern(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(PRESSES)}")
    try:
        ratios = [float(r) for r in args.ratios.split(",")]
    except ValueError:
        ap.error(f"--ratios must be comma-separated numbers, got {args.ratios!r}")
    if not all(0 < r < 1 for r in ratios):
        ap.error(f"every ratio must lie in (0, 1), got {args.ratios!r}")
    if args.prompts < 1 or args.prompt_len < 16:
        ap.error("--prompts must be >= 1 and --prompt-len >= 16")

    from polykv_search.models import load_model

    model, tokenizer = load_model(args.model, attn_implementation="sdpa")
    prompts = prompts_from_corpus(tokenizer, args.prompts, args.prompt_len)
    mine = {name: ours(model, name, PRESSES[name].params, prompts, ratios) for name in names}
    print(f"polykv-search side done: {len(names)} pattern(s) x {len(ratios)} ratio(s) x {len(prompts)} prompt(s)")

    python = ensure_venv(args.venv, args.kvpress, args.torch)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="polykv-kvpress-patterns-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = {
        "model": str(Path(args.model).expanduser()),
        "prompts": prompts,
        "ratios": ratios,
        "patterns": {
            n: {"press": PRESSES[n].press, "kwargs": PRESSES[n].kwargs, "kept": PRESSES[n].kept} for n in names
        },
        "out": str(work / "kvpress_kept.json"),
    }
    (work / "spec.json").write_text(json.dumps(spec))
    rc = run_in_venv(python, CHILD, work / "kept_in_kvpress_env.py", str(work / "spec.json"))
    if rc != 0:
        print(f"the kvpress side failed (exit {rc})")
        return 1
    theirs = json.loads((work / "kvpress_kept.json").read_text())

    report, ok = {}, True
    print(f"\n{len(prompts)} prompt(s) of {args.prompt_len} tokens, {model.config.num_hidden_layers} layers")
    for name in names:
        table = compare(mine[name], theirs[name], args.prompt_len, args.tie_tol)
        report[name] = table
        print(f"\n== {name} vs kvpress {PRESSES[name].press}")
        print(f"{'ratio':>6} {'budget':>6} {'identical':>16} {'differing':>9} {'near-ties':>9} {'swapped':>13} max gap")
        for r in table:
            ident = f"{r['identical']}/{r['heads']} ({100 * r['identical_share']:.1f}%)"
            swapped = f"{r['swapped_mean']:.2f} (max {r['swapped_max']})"
            print(
                f"{r['ratio']:>6} {r['budget']:>6} {ident:>16} {r['differing']:>9} {r['near_ties']:>9} "
                f"{swapped:>13} {r['max_cutoff_gap']:.1e}"
            )
            if r["inexact_matches"]:
                print(f"       ({r['inexact_matches']} head(s) matched kvpress's kept keys only approximately)")
            ok &= r["near_ties"] == r["differing"]
        differing = sum(r["differing"] for r in table)
        ties = sum(r["near_ties"] for r in table)
        verdict = (
            "PASS: identical kept sets"
            if differing == 0
            else f"PASS: {differing} differing head(s), all near-ties (float rounding at the cut-off)"
            if ties == differing
            else f"FAIL: {differing - ties} differing head(s) are not near-ties"
        )
        print(f"== {name}: {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"prompt_len": args.prompt_len, "prompts": len(prompts), "patterns": report}))
    print("\nsummary: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
