#!/usr/bin/env python
"""Verify `polykv-search export --format kvpress` against the real kvpress, in its own virtualenv.

kvpress 0.5.x pins transformers < 5.3 while polykv-search needs transformers 5.24, so the press is
checked in a separate virtual environment. This script (run with the project's Python):

1. builds test strategies for the model's layer count and exports them with
   ``polykv-search export --format kvpress`` (module + JSON sidecar);
2. creates (or reuses) a virtualenv with ``kvpress`` and torch (``--venv``, default
   ``~/.cache/polykv-search/kvpress-venv``);
3. inside it, applies each exported press to a model — a tiny random-init Llama by default, or a
   local checkpoint (``--model PATH``, e.g. ``~/.cache/polykv-search/models/smollm2-135m-*``) —
   and checks every layer's cache length after prefill (``min(n, budget)``; full layers keep ``n``)
   and after each decoding step (capped at the decoding budget where kvpress has a decoding press,
   growing by one where the layer keeps everything or its decoding pattern is dropped);
4. prints a table per check and exits 0 when every check passes, 1 otherwise.

Checks: ``sdpa`` — every pattern kvpress can run under SDPA (prefill + decoding, batch 1, one token
per step); ``eager-h2o`` — h2o layers (ObservedAttentionPress needs attention weights) under eager
attention, prefill only, plus one decoding step reported as information (transformers' eager mask
has one length for all layers). With a local checkpoint that has a tokenizer, kvpress's own
text-generation pipeline is also run with the press and its outcome reported as information (it
feeds the question as one multi-token step, which needs flash attention once layer lengths differ).

Not part of the default test run (it installs packages). Usage::

    python scripts/verify_kvpress_export.py                       # tiny random Llama
    python scripts/verify_kvpress_export.py --model ~/.cache/polykv-search/models/smollm2-135m-*
    python scripts/verify_kvpress_export.py --kvpress "kvpress==0.5.5" --venv /tmp/kvp-venv
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

from kvpress_venv import DEFAULT_KVPRESS, DEFAULT_TORCH, DEFAULT_VENV, ensure_venv, run_in_venv  # noqa: E402


def build_strategies(num_layers: int, prompt_len: int):
    """Strategies that exercise every kvpress mapping, with budgets below the prompt length."""
    import polykv_search  # noqa: F401  (registers the pattern catalog that strategies validate against)
    from strategies import LayerChoice, Strategy

    pre_cycle = [
        ("full", None),
        ("streaming_llm", {"n_sink": 4}),
        ("tova", {}),
        ("snapkv", {"window": 16}),
        ("pyramidkv", {}),
        ("knorm", {}),
        ("random", {"seed": 3}),
    ]
    dec_cycle = [
        ("streaming_llm", {"n_sink": 4}),
        ("tova", {}),
        ("knorm", {}),
        ("random", {"seed": 1}),
        ("full", None),
        ("snapkv", {}),
    ]
    prefill, decoding = [], []
    for i in range(num_layers):
        b = 24 + (i * 13) % (prompt_len // 2)  # varied per layer, < prompt_len
        name, params = pre_cycle[i % len(pre_cycle)]
        prefill.append(LayerChoice(name, b, params or {}))
        name, params = dec_cycle[i % len(dec_cycle)]
        decoding.append(LayerChoice(name, b - 4 if i % 2 else b + 2, params or {}))
    sdpa = Strategy(prefill, decoding, global_budget=None, b_min=1, provenance={"solver": "verify_kvpress_export"})
    h2o_pre = [
        LayerChoice("h2o", 20 + 7 * (i % 5)) if i % 2 == 0 else LayerChoice("knorm", 30 + i) for i in range(num_layers)
    ]
    h2o_dec = [LayerChoice("full", None)] * num_layers
    eager = Strategy(h2o_pre, h2o_dec, global_budget=None, b_min=1, provenance={"solver": "verify_kvpress_export"})
    return {"sdpa": sdpa, "eager-h2o": eager}


CHILD = r"""
import importlib.metadata, importlib.util, json, sys, traceback
import torch
import transformers
import kvpress
from transformers import DynamicCache

spec = json.loads(sys.argv[1])
torch.manual_seed(0)
transformers.utils.logging.disable_progress_bar()
print(
    f"kvpress {importlib.metadata.version('kvpress')}, transformers {transformers.__version__}, "
    f"torch {torch.__version__}"
)


def load_model(attn):
    if spec["model"] == "tiny":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=spec["num_layers"],
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
        cfg._attn_implementation = attn
        return LlamaForCausalLM(cfg).eval(), None
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation=attn, dtype=torch.float32).eval()
    try:
        tok = AutoTokenizer.from_pretrained(spec["model"])
    except Exception:
        tok = None
    return model, tok


def load_press(path):
    name = "exported_press_" + path.replace("/", "_").replace(".", "_")
    s = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(s)
    sys.modules[name] = mod
    s.loader.exec_module(mod)
    return mod


def lengths(cache):
    return [int(layer.keys.shape[-2]) for layer in cache.layers]


def expected_prefill(strategy, n):
    out = []
    for entry in strategy["layers"]:
        c = entry["prefill"]
        b = c["budget"]
        out.append(n if c["pattern"] == "full" or b is None or n <= b else b)
    return out


def expected_step(strategy, sidecar, prev):
    out = []
    for entry, side, length in zip(strategy["layers"], sidecar["layers"], prev):
        new = length + 1
        if side["decoding"]["kvpress"] is not None and new > entry["decoding"]["budget"]:
            new = entry["decoding"]["budget"]
        out.append(new)
    return out


def run_check(name, check):
    strategy = json.load(open(check["strategy"]))
    sidecar = json.load(open(check["sidecar"]))
    mod = load_press(check["module"])
    model, tok = load_model(check["attn"])
    n = spec["prompt_len"]
    ids = torch.randint(3, model.config.vocab_size, (1, n))
    press = mod.make_press()
    ok = True
    rows = []
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        got, want = lengths(cache), expected_prefill(strategy, n)
        rows.append(("prefill", got, want))
        ok &= got == want
        steps = check["decode_steps"]
        for t in range(steps):
            pos = n + t
            nxt = out.logits[:, -1:].argmax(-1)
            try:
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True,
                            cache_position=torch.tensor([pos]), position_ids=torch.tensor([[pos]]))
            except Exception as err:
                rows.append((f"step {t + 1}", f"{type(err).__name__}: {str(err).splitlines()[0][:160]}", None))
                if check.get("decode_informational"):
                    break
                ok = False
                break
            want = expected_step(strategy, sidecar, got)
            got = lengths(cache)
            rows.append((f"step {t + 1}", got, want))
            if not check.get("decode_informational"):
                ok &= got == want
    print(f"\n== {name}: attn={check['attn']}, prompt {n} tokens, {len(strategy['layers'])} layers")
    print("patterns prefill: " + " ".join(e["prefill"]["pattern"] for e in strategy["layers"]))
    print("patterns decoding: " + " ".join(e["decoding"]["pattern"] for e in strategy["layers"]))
    for label, got, want in rows:
        if want is None:
            print(f"  {label:>8}: {got}" + ("  (information only)" if check.get("decode_informational") else "  FAIL"))
        else:
            informational = label != "prefill" and check.get("decode_informational")
            flag = "ok" if got == want else ("differs (information only)" if informational else "FAIL")
            print(f"  {label:>8}: {got}  {flag}" + ("" if got == want else f"\n  {'expected':>8}: {want}"))
    if check.get("pipeline") and tok is not None:
        # Information only: kvpress's pipeline feeds the question as one multi-token step after the
        # compressed context, which transformers' one-mask-for-all-layers allows only with flash attention.
        from transformers import pipeline
        try:
            pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok)
            context = "Jane Austen wrote six novels. " * (n // 6)
            question = " How many novels did she write?"
            answer = pipe(context, question=question, press=mod.make_press(), max_new_tokens=8)["answer"]
            print(f"  pipeline (information only): answer {answer!r}")
        except Exception as err:
            print(f"  pipeline (information only): {type(err).__name__}: {str(err).splitlines()[0][:160]}")
    print(f"== {name}: {'PASS' if ok else 'FAIL'}")
    return ok


results = {}
for name, check in spec["checks"].items():
    try:
        results[name] = run_check(name, check)
    except Exception:
        traceback.print_exc()
        print(f"== {name}: FAIL (exception)")
        results[name] = False
print("\nsummary: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in results.items()))
sys.exit(0 if all(results.values()) else 1)
"""


def num_layers_of(model: str) -> int:
    if model == "tiny":
        return 8
    config = json.loads((Path(model) / "config.json").read_text())
    return int(config.get("num_hidden_layers") or config["text_config"]["num_hidden_layers"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", default="tiny", help="'tiny' (random-init Llama, default) or a local HF checkpoint directory"
    )
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"virtualenv for kvpress (default {DEFAULT_VENV})")
    ap.add_argument("--kvpress", default=DEFAULT_KVPRESS, help="pip requirement for kvpress")
    ap.add_argument("--torch", default=DEFAULT_TORCH, help="pip requirement for torch in the virtualenv")
    ap.add_argument("--prompt-len", type=int, default=160)
    ap.add_argument("--decode-steps", type=int, default=6)
    ap.add_argument("--workdir", type=Path, help="where the exported files go (default: a temporary directory)")
    args = ap.parse_args(argv)

    from strategies.exporters import export_strategy

    num_layers = num_layers_of(args.model)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="polykv-kvpress-"))
    work.mkdir(parents=True, exist_ok=True)
    checks = {}
    for name, strategy in build_strategies(num_layers, args.prompt_len).items():
        stem = name.replace("-", "_")
        strategy.save(work / f"{stem}_strategy.json")
        # the same code path as `polykv-search export --format kvpress --out {stem}_press.py`
        export_strategy(strategy, "kvpress", work / f"{stem}_press.py")
        checks[name] = {
            "strategy": str(work / f"{stem}_strategy.json"),
            "module": str(work / f"{stem}_press.py"),
            "sidecar": str(work / f"{stem}_press.json"),
            "attn": "eager" if name.startswith("eager") else "sdpa",
            "decode_steps": 1 if name.startswith("eager") else args.decode_steps,
            "decode_informational": name.startswith("eager"),
            "pipeline": name == "sdpa" and args.model != "tiny",
        }
    print(f"exported {len(checks)} presses to {work}", flush=True)
    python = ensure_venv(args.venv, args.kvpress, args.torch)
    spec = {"model": args.model, "num_layers": num_layers, "prompt_len": args.prompt_len, "checks": checks}
    return run_in_venv(python, CHILD, work / "check_in_kvpress_env.py", json.dumps(spec))


if __name__ == "__main__":
    sys.exit(main())
