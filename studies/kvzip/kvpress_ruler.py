"""Exploratory (study artifact, not a tool): a results file's generation samples through kvpress's own presses.

Regenerates the samples of ``RESULTS`` (its settings and seed; their fingerprints checked) for ``--task``, runs
each through kvpress presses in kvpress's virtualenv (``scripts/kvpress_venv.py``) as kvpress's pipeline does
(the context prefilled under the press; the question, then greedy answer tokens, after it, positions continuing
the context's), scores the answers with the same task code and prints each entry's score beside the file's
entries, with paired differences to ``--ref`` (``polykv_search.stats``, as ``compare``). A press is
``NAME=CLASS[|JSON kwargs[|JSON attributes set inside the press]]``; its compression ratio is, per sample,
``1 - B / context tokens`` (the file's B) unless the kwargs give ``compression_ratio``; ``"per_head": true``
in a ``KVzipPress``'s kwargs masks by its scores with this project's rule instead of its own (every KV head
keeps its top B, the sinks first), isolating the allocation. kvpress compresses the
context only: the question and the answer stay on top of B, while the file's entries hold B through the
question call and decoding. ``--report OUT`` reprints a finished run. Usage (studies/kvzip/study_kvzip.md), from the
repository root::

    python -m studies.kvzip.kvpress_ruler studies/kvzip/h8-agnostic-50.json.xz --model DIR \\
        --task ruler/niah_single --press 'full=KnormPress|{"compression_ratio": 0.0}' \\
        --press 'kvzip_global=KVzipPress|{"layerwise": false}|{"prefix_length": 0}' --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from polykv_search import scoring
from polykv_search.evaluation.runner import eos_token_ids, generation_limit
from polykv_search.evaluation.samples import encode_prompt, samples_fingerprint
from polykv_search.io import read_text
from polykv_search.models import load_model
from polykv_search.stats import mean_interval, paired_difference_interval
from scripts.kvpress_venv import DEFAULT_VENV, ensure_venv, run_in_venv

CHILD = r"""
import json, logging, sys, time
import torch, transformers, kvpress
from transformers import AutoModelForCausalLM, DynamicCache

spec = json.load(open(sys.argv[1]))
transformers.utils.logging.disable_progress_bar()
logging.getLogger("kvpress").setLevel(logging.ERROR)
torch.set_num_threads(2)
model = AutoModelForCausalLM.from_pretrained(spec["model"], attn_implementation="sdpa", dtype=torch.float32).eval()
eos, out, t0 = set(spec["eos"]), {}, time.time()
with torch.no_grad():
    for name, p in spec["presses"].items():
        rows = []
        for i, s in enumerate(spec["samples"]):
            ctx = torch.tensor([s["context"]])
            n = ctx.shape[1]
            kw = dict(p["kwargs"])
            ratio = kw.pop("compression_ratio", 1 - spec["budget"] / n)
            per_head = kw.pop("per_head", False)
            press = getattr(kvpress, p["cls"])(compression_ratio=ratio, **kw)
            if per_head:  # KVzipPress's scores, every KV head keeping its own top B (sinks first)
                def post(model_, _press=press, _b=int(spec["budget"])):
                    sv = _press.score_val  # [layers, batch, Hkv, n]
                    sv[..., : _press.n_sink] = sv.amax() + 1.0
                    for layer in model_.model.layers:
                        low = torch.topk(-sv[int(layer.self_attn.layer_idx)], max(sv.shape[-1] - _b, 0), dim=-1).indices
                        where = torch.nonzero(torch.ones_like(low, dtype=torch.bool), as_tuple=True)
                        layer.self_attn.masked_key_indices = (where[0], where[1], low.flatten())
                press.compress_post = post
            for layer in model.model.layers:
                layer.self_attn.masked_key_indices = None
            cache = DynamicCache()
            with press(model):
                for k, v in p["setup"].items():
                    setattr(press, k, v)
                model.model(input_ids=ctx, past_key_values=cache)
            q = torch.tensor([s["question"]])
            pos = torch.arange(n, n + q.shape[1]).unsqueeze(0)
            logits = model(input_ids=q, past_key_values=cache, position_ids=pos, logits_to_keep=1).logits[0, -1]
            new = []
            for step in range(s["limit"]):  # as the project's greedy_generate: EOS ends it, unkept
                tok = int(logits.argmax())
                if tok in eos:
                    break
                new.append(tok)
                if step + 1 == s["limit"]:
                    break
                at = pos[:, -1:] + 1 + step
                logits = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, position_ids=at).logits[0, -1]
            rows.append(new)
            if i % 10 == 0:
                print(f"{name}: {i + 1}/{len(spec['samples'])} ({time.time() - t0:.0f} s)", flush=True)
        out[name] = rows
json.dump(out, open(sys.argv[2], "w"))
"""


def parse_press(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition("=")
    cls, *parts = rest.split("|", 2)
    if not name or not cls:
        raise SystemExit(f"error: --press {spec!r}: expected NAME=CLASS[|JSON kwargs[|JSON attributes]]")
    kwargs, setup = (json.loads(p) for p in (parts + ["{}", "{}"])[:2])
    return name, {"cls": cls, "kwargs": kwargs, "setup": setup}


def run(args) -> dict:
    doc = json.loads(read_text(args.results))
    prov, st = doc["provenance"], doc["provenance"]["settings"]
    if prov["protocol"] != "question-agnostic":
        raise SystemExit("error: kvpress's pipeline compresses the context only: give a question-agnostic file")
    model, tok = load_model(args.model)
    texts, _ = scoring.eval_texts(st["corpus"])
    tasks = scoring.resolve_tasks(st["suite"])  # every task, so that each keeps its seed offset
    made = scoring.make_task_samples(
        tok, tasks, texts, n_samples=st["samples"], context_len=st["context_len"], seed=st["seed"]
    )
    task, samples = made[args.task]
    if samples_fingerprint(samples) != prov["tasks"][args.task]["samples"]:
        raise SystemExit(f"error: {args.task}: the regenerated samples differ from the file's")
    samples = samples[: args.first]
    rows = []
    for s in samples:
        context, question = encode_prompt(tok, s)
        rows.append(
            {"context": context, "question": question, "limit": generation_limit(task, s, st["max_new_tokens"])}
        )
    presses = dict(parse_press(p) for p in args.press)
    work = Path(tempfile.mkdtemp(prefix="kvpress-ruler-"))
    spec = {"model": args.model, "eos": sorted(eos_token_ids(model, tok)), "budget": st["budget"]}
    (work / "spec.json").write_text(json.dumps({**spec, "presses": presses, "samples": rows}))
    rc = run_in_venv(
        ensure_venv(DEFAULT_VENV), CHILD, work / "child.py", str(work / "spec.json"), str(work / "ids.json")
    )
    if rc != 0:
        raise SystemExit(f"the kvpress side failed (exit {rc})")
    ids = json.loads((work / "ids.json").read_text())
    result = {"results": args.results, "task": args.task, "presses": presses, "entries": {}, "predictions": {}}
    for e in doc["entries"]:
        per = e["tasks"][args.task]["per_sample"][: args.first]
        result["entries"][e["name"]] = [r["score"] for r in per]
        result["predictions"][e["name"]] = [r["prediction"] for r in per]
    for name, got in ids.items():
        preds = [tok.decode(x, skip_special_tokens=True) for x in got]
        result["entries"][f"kvpress:{name}"] = [task.score([p], [s]) for p, s in zip(preds, samples)]
        result["predictions"][f"kvpress:{name}"] = preds
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


def report(result: dict, ref: str) -> None:
    entries = result["entries"]
    print(f"{result['task']}, {len(next(iter(entries.values())))} samples; mean [95 %], paired minus {ref}")
    for name, scores in entries.items():
        m = mean_interval(scores)
        line = f"{name:32s} {m.estimate:5.1f} [{m.low:5.1f}, {m.high:5.1f}]"
        if name != ref and ref in entries:
            d = paired_difference_interval([scores], [entries[ref]])
            line += f"  {d.estimate:+6.1f} [{d.low:+.1f}, {d.high:+.1f}]{' resolved' if d.excludes_zero else ''}"
        print(line)
    preds = result["predictions"]
    if "full" in preds and "kvpress:full" in preds:  # the harness check: no compression, our FullKV's answers
        same = sum(a == b for a, b in zip(preds["full"], preds["kvpress:full"]))
        print(f"harness: kvpress uncompressed gives FullKV's answer on {same} of {len(preds['full'])} samples")


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("results", nargs="?", help="a question-agnostic results file of `polykv-search score`")
    ap.add_argument("--model", help="the file's model, a local checkpoint directory")
    ap.add_argument("--task", help="one generation task of the file, e.g. ruler/niah_single")
    ap.add_argument("--press", action="append", default=[], help="NAME=CLASS[|JSON kwargs[|JSON attrs]]")
    ap.add_argument("--out", help="where the per-sample scores and answers go (JSON)")
    ap.add_argument("--first", type=int, default=None, help="only the task's first N samples (a smoke run)")
    ap.add_argument("--ref", default="uniform-tova", help="paired differences against this entry")
    ap.add_argument("--report", help="reprint a finished run's JSON instead of running")
    args = ap.parse_args()
    if args.report:
        report(json.loads(Path(args.report).read_text()), args.ref)
        return
    if not (args.results and args.model and args.task and args.press and args.out):
        ap.error("give RESULTS, --model, --task, --press and --out (or --report)")
    report(run(args), args.ref)


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
