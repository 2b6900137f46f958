#!/usr/bin/env python
"""Check polykv-search's query-agnostic patterns against kvpress's presses: the same kept token sets.

For each check (:data:`PRESSES`; ``--patterns`` picks checks by name or by pattern), each compression
ratio (``--ratios``) and each prompt (``--prompts`` windows of ``--prompt-len`` tokens from the
``austen`` corpus), this script (run with the project's Python):

1. prefills the prompt under ``uniform-<pattern>`` at budget ``b = max(1, int(n * (1 - ratio)))``
   (kvpress's ``compute_n_kept``) and reads every (layer, KV head)'s kept positions; a pooled kvzip check
   (``allocation`` ``layer`` or ``model``) instead gives each KV head its own budget so that every pool holds
   exactly the tokens KVzipPress keeps (``Hkv*n - int(Hkv*n*ratio)`` per layer, ``L*Hkv*n - int(L*Hkv*n*ratio)``
   over the model: not a multiple of ``Hkv`` in general), so the sides differ only where they rank differently;
2. in the kvpress virtualenv (``scripts/kvpress_venv.py``; kvpress pins transformers < 5.3), prefills
   the same token ids under the matching press at that ratio and reads its kept positions, plus the
   press's scores;
3. prints, per check and ratio, the share of (prompt, layer, head) kept sets that are identical, the
   tokens swapped where they differ, the overlap (Jaccard index of the differing heads' sets and of
   each layer's (head, position) pairs; share of our kept tokens kvpress keeps too), and whether each
   differing head is a near-tie: every swapped token's kvpress score lies within ``--tie-tol``
   (relative to the head's 10th-90th percentile score range) of kvpress's own cut-off score, i.e. the
   two sides rank tokens the same up to float rounding.

A check says how kvpress's kept positions are read (``kept``): ``cache``, the press shrinks the cache
and kept keys are matched to the uncompressed prefill's keys; ``masked``, the press keeps the cache and
masks ``module.masked_key_indices`` (KVzipPress, as AdaKV). A masked press drops its lowest scores over
all heads of a layer (or of the model) at once, so its heads keep different numbers of tokens; its
scores (``score_val``) are then also ranked by our rule, per head top-``b`` with the sinks kept
(:func:`kvpress_kept.top_b_from_scores`), and that comparison is the one with a verdict. Checks with
``same=False`` measure a documented difference (another budget allocation, chunking, the chat
template's prefix) and never fail the run. Exit 0 when every ``same`` check differs only by near-ties.

Not part of the default test run (it installs packages). Usage::

    python scripts/verify_kvpress_patterns.py --model ~/.cache/polykv-search/models/smollm2-135m-*
    python scripts/verify_kvpress_patterns.py --model PATH --patterns kvzip --ratios 0.5,0.75,0.9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from kvpress_checks import PRESSES, Press  # noqa: E402, F401  (Press: re-exported)
from kvpress_kept import (  # noqa: E402
    budget_for,
    compare,
    kept_share,
    pool_budgets,
    print_table,
    top_b_side,
    verdict,
)
from kvpress_venv import DEFAULT_KVPRESS, DEFAULT_TORCH, DEFAULT_VENV, ensure_venv, run_in_venv  # noqa: E402

CHILD = r"""
import importlib.metadata, json, logging, sys
import torch
import transformers
import kvpress
from transformers import AutoModelForCausalLM, DynamicCache

spec = json.load(open(sys.argv[1]))
transformers.utils.logging.disable_progress_bar()
logging.getLogger("kvpress").setLevel(logging.ERROR)
print(f"kvpress {importlib.metadata.version('kvpress')}, transformers {transformers.__version__}, "
      f"torch {torch.__version__}", flush=True)
model = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa", dtype=torch.float32).eval()
layers = model.model.layers
num_kv = model.config.num_key_value_heads


def kept_from_cache(cache, full, n):
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


def kept_from_mask(cache, full, n):
    out = []
    for layer in layers:
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        heads = [set(range(n)) for _ in range(num_kv)]
        if masked is not None:
            for b, h, s in zip(*(t.tolist() for t in masked)):
                if b == 0:
                    heads[h].discard(s)
        out.append([sorted(s) for s in heads])
    return out, 0


READERS = {"cache": kept_from_cache, "masked": kept_from_mask}
result = {}
with torch.no_grad():
    for name, entry in spec["checks"].items():
        for p, ids in enumerate(entry["prompts"]):
            ids = torch.tensor([ids])
            full = None
            if entry["kept"] == "cache":
                full_cache = DynamicCache()
                model(input_ids=ids, past_key_values=full_cache, use_cache=True)
                full = [layer.keys.clone() for layer in full_cache.layers]
            for ratio in spec["ratios"]:
                press = getattr(kvpress, entry["press"])(compression_ratio=ratio, **entry["kwargs"])
                scores = {}
                if entry["kept"] == "masked":
                    # KVzipPress holds its scores [layers, batch, Hkv, n] in score_val until compress_post
                    def grab(model_, _post=press.compress_post, _press=press):
                        scores.update(enumerate(_press.score_val[:, 0].double().tolist()))
                        return _post(model_)
                    press.compress_post = grab
                elif hasattr(press, "score"):
                    def record(module, *args, _score=press.score, **kw):
                        s = _score(module, *args, **kw)
                        scores[module.layer_idx] = s[0].double().tolist()
                        return s
                    press.score = record
                for layer in layers:
                    layer.self_attn.masked_key_indices = None
                cache = DynamicCache()
                with press(model):
                    attrs = {key: getattr(press, key) for key in entry["setup"]}
                    if "prefix_length" in dir(press):
                        attrs.setdefault("prefix_length", press.prefix_length)
                    for key, value in entry["setup"].items():
                        setattr(press, key, value)
                    model(input_ids=ids, past_key_values=cache, use_cache=True)
                kept, inexact = READERS[entry["kept"]](cache, full, ids.shape[1])
                row = {"kept": kept, "inexact": inexact, "attrs": attrs}
                if scores:
                    row["scores"] = [scores[i] for i in range(len(layers))]
                result.setdefault(name, {}).setdefault(str(ratio), []).append(row)
                print(f"prompt {p}: {name} ratio {ratio} done", flush=True)
json.dump(result, open(spec["out"], "w"))
"""


def prompts_from_corpus(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` windows of ``length`` token ids, spread over the austen corpus."""
    from polykv_search.data import load_corpus

    text = "\n\n".join(doc.text for doc in load_corpus("austen").documents)
    ids = tokenizer(text[: 40 * length * (count + 1)], add_special_tokens=False)["input_ids"]
    if len(ids) < length * count:
        raise SystemExit(f"error: the corpus gives {len(ids)} tokens, fewer than {count} x {length}")
    step = (len(ids) - length) // max(1, count)
    return [ids[i * step : i * step + length] for i in range(count)]


def chat_prefix_ids(tokenizer) -> list[int]:
    """The chat template's prefix as kvpress's pipeline and KVzipPress cut it (none without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    dummy = "dummy context"
    separator = "\n" + "#" * len(dummy)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": dummy + separator}], add_generation_prompt=True, tokenize=False
    )
    prefix = text.split(separator)[0].split(dummy)[0]
    return tokenizer(prefix, add_special_tokens=False)["input_ids"]


def strategy_for(name: str, params: dict, n: int, ratio: float, layers: int, heads: int):
    """The strategy a check runs at ``ratio`` on ``n`` tokens: ``uniform-<name>`` at kvpress's per-head budget
    (``compute_n_kept``); for a pooled allocation, one head group per KV head whose budgets make each pool hold
    exactly the tokens KVzipPress keeps (:func:`kvpress_kept.pool_budgets`), so that kept sets differ only where
    the two rank tokens differently, never by a count that a pool of ``heads * b`` tokens cannot reach."""
    from strategies import LayerChoice, Strategy
    from strategies.head_groups import HeadGroup

    allocation = params.get("allocation", "head")
    if allocation == "head":
        return Strategy.uniform(layers, name, budget_for(n, ratio), params=params)
    choices = [
        LayerChoice.grouped(HeadGroup((h,), name, b, dict(params)) for h, b in enumerate(row))
        for row in pool_budgets(n, ratio, layers, heads, allocation)
    ]
    return Strategy(choices, choices, None, 1, {"solver": "kvpress-count"}, context_len=n, num_kv_heads=heads)


def ours(model, name: str, params: dict, prompts, ratios) -> dict:
    """Our kept positions: {ratio: [per prompt: [layer][head] sorted positions]}."""
    import torch

    from polykv_search.runtime import apply_strategy

    layers, heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    out = {}
    for ratio in ratios:
        rows = []
        for ids in prompts:
            strategy = strategy_for(name, params, len(ids), ratio, layers, heads)
            with apply_strategy(model, strategy) as rt, torch.no_grad():
                model(torch.tensor([ids]), use_cache=True)
                cache = rt.last_cache
            rows.append([held_positions(layer) for layer in cache.layers])
        out[str(ratio)] = rows
    return out


def held_positions(layer) -> list[list[int]]:
    """Per KV head, the sorted positions layer ``layer`` holds for row 0 (a layer of head groups: its cells')."""
    out: dict[int, list[int]] = {}
    for cell, heads in layer.cells():
        for i, h in enumerate(range(cell.positions.shape[1]) if heads is None else heads):
            out[h] = sorted(cell.positions[0, i][cell.valid[0, i]].tolist())
    return [out[h] for h in sorted(out)]


def selected_checks(names: list[str]) -> tuple[list[str], list[str]]:
    """The checks named, or of the patterns named (``kvzip`` selects every kvzip check); unknown names."""
    chosen = [c for c, p in PRESSES.items() if c in names or (p.pattern or c) in names]
    known = set(PRESSES) | {p.pattern for p in PRESSES.values() if p.pattern}
    return chosen, [n for n in names if n not in known]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="a local HF checkpoint directory (e.g. smollm2-135m-*)")
    ap.add_argument(
        "--patterns", default=",".join(PRESSES), help=f"comma-separated checks or patterns, of: {', '.join(PRESSES)}"
    )
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
    checks, unknown = selected_checks(names)
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
    from polykv_search.patterns import PATTERNS

    model, tokenizer = load_model(args.model, attn_implementation="sdpa")
    windows = prompts_from_corpus(tokenizer, args.prompts, args.prompt_len)
    prefix = chat_prefix_ids(tokenizer)
    prompts = {c: [prefix + w for w in windows] if PRESSES[c].chat_prefix else windows for c in checks}
    mine = {}
    for c in checks:
        entry = PRESSES[c]
        mine[c] = ours(model, entry.pattern or c, entry.params, prompts[c], ratios)
        print(f"polykv-search side done: {c}", flush=True)

    python = ensure_venv(args.venv, args.kvpress, args.torch)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="polykv-kvpress-patterns-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = {
        "model": str(Path(args.model).expanduser()),
        "ratios": ratios,
        "checks": {
            c: {
                "press": PRESSES[c].press,
                "kwargs": PRESSES[c].kwargs,
                "kept": PRESSES[c].kept,
                "setup": PRESSES[c].setup,
                "prompts": prompts[c],
            }
            for c in checks
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
    print(f"\n{len(windows)} prompt(s) of {args.prompt_len} tokens, {model.config.num_hidden_layers} layers")
    print("J(diff): mean Jaccard of the differing heads' sets; J(layer): of each layer's (head, token) pairs;")
    print("common: share of our kept tokens that kvpress keeps too; kept/head: ours/kvpress's, mean")
    for c in checks:
        entry = PRESSES[c]
        n = len(prompts[c][0])
        kind = "" if entry.same else " (a measured difference, no verdict)"
        note = f": {entry.note}" if entry.note else ""
        print(f"\n== {c}: {entry.pattern or c} vs kvpress {entry.press}{kind}{note}")
        masked = entry.kept == "masked"
        # a masked press's heads keep different numbers of tokens: its own kept sets are compared for
        # overlap only, and its scores, ranked by our rule, decide
        plain = {r: [{k: v for k, v in x.items() if k != "scores"} for x in rows] for r, rows in theirs[c].items()}
        as_kept = compare(mine[c], plain if masked else theirs[c], n, args.tie_tol)
        row = {
            "pattern": entry.pattern or c,
            "press": entry.press,
            "kwargs": entry.kwargs,
            "params": entry.params,
            "setup": entry.setup,
            "press_defaults": theirs[c][str(ratios[0])][0].get("attrs", {}),
            "prompt_tokens": n,
            "same": entry.same,
            "note": entry.note,
            "as_kept": as_kept,
        }
        decisive, n_sink = as_kept, 0
        if masked and entry.params.get("allocation", "head") != "head":
            # our pooled allocation is kvpress's own: its masks decide (near-ties judged on its scores)
            decisive = row["as_kept"] = compare(mine[c], theirs[c], n, args.tie_tol)
            print_table("-- kvpress's own selection (its masks), our pooled allocation", decisive)
        elif masked:
            print_table("-- kvpress's own selection (its masks)", as_kept)
            pattern = PATTERNS[entry.pattern or c](**entry.params)
            n_sink = getattr(pattern, "n_sink", 0)
            decisive = row["top_b"] = compare(mine[c], top_b_side(theirs[c], n, n_sink), n, args.tie_tol)
            print_table("-- kvpress's scores, our rule (per head top-b, first n_sink kept)", decisive)
        else:
            print_table("-- kept sets", as_kept)
        if entry.chat_prefix and n_sink < len(prefix):
            # the chat template's prefix past the sinks: kvpress's pass neither repeats nor scores it
            lo, hi = n_sink, len(prefix)
            shares = {
                r: [kept_share(mine[c][r], lo, hi), kept_share([x["kept"] for x in rows], lo, hi)]
                for r, rows in theirs[c].items()
            }
            row["prefix_tokens"], row["prefix_kept_share_ours_theirs"] = hi, shares
            print(f"-- the template's prefix tokens {lo}..{hi - 1}, share kept (ours, kvpress's): {shares}")
        good, words = verdict(decisive)
        row["verdict"] = words
        if entry.same:
            ok &= good
            print(f"== {c}: {'PASS' if good else 'FAIL'}: {words}")
        else:
            print(f"== {c}: {words}")
        report[c] = row
    if args.json:
        out = {"prompt_len": args.prompt_len, "prompts": len(windows), "ratios": ratios, "checks": report}
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.json)  # atomic: never a half-written file
    print("\nsummary: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
