"""The device check: is the runtime exact on this accelerator, and how fast is it? One command.

    python benchmarks/gpu_check.py --out runs/gpu_check            # a CUDA machine: about 8 min on one GPU
    python benchmarks/gpu_check.py --smoke --out /tmp/gpu_check    # CPU, seconds (the default test suite runs it)

(a) **Exactness on the device**, on the random-init tiny models of every family (no download):
    every evicting pattern uniform, KVzip's pooled allocation (``kvzip[allocation=model]``: heads of different
    lengths, one pool over the model) and a strategy mixing patterns and budgets per layer and phase, left-padded
    batch of 2, prefill + a teacher-forced continuation call + forced single-token steps. The runtime runs on
    the device in each dtype and attention kernel; the full-cache masking oracle (``tests/oracle.py``) runs on
    a CPU fp32 copy with the same inputs. Reported: the share of (layer, row, head) kept sets equal to the
    oracle's and the largest |logit difference| on real tokens. Then the shared scoring engine against the
    per-entry path, both on the device: identical predictions and KV bytes, and the largest |logit difference|.
    Tolerances (asserted, exit 1 when missed): fp32 — every kept set equal, logits within 1e-3 of the oracle
    (TF32 off), the two engines' predictions identical; bf16 — reported, not asserted: one bf16 rounding
    flips near-tied scores, so kept sets may differ from an fp32 oracle without any bug.
    Kernels: ``sdpa`` and ``eager`` always, ``flash_attention_2`` when the package is installed (CUDA only).
(b) **Speed**: ``bench_runtime.py`` at 4k/8k/16k and ``bench_score.py`` at 4k/8k on SmolLM2 on the device,
    then the query-agnostic patterns side by side at 4k (``bench_runtime.py --pattern
    snapkv,kvzip,kvzip[allocation=model],keydiff,expected_attention --paired-to snapkv``, 4 repeats, k = 1:
    kvzip's prefill and every new pattern's decode over snapkv's, per repeat, with intervals); then kvzip
    against snapkv the same way on two layers of Llama-3.1-8B's shape with random weights
    (``shape_model.py``, written to ``--out``; 2.44× snapkv's prefill on a CPU, studies/kvzip/study_kvzip.md), the
    regime of the KVzip paper's ~2×; their JSON in ``--out`` (``--smoke``: 128-token runs on the CPU, the
    shape a small stand-in). The pattern comparisons' time on a GPU is not measured yet.
(c) **Summary**: one screen; ``summary.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # runtime_pairs, when loaded as a module (tests)

import runtime_pairs  # noqa: E402

from polykv_search.cli import Parser, UsageError  # noqa: E402
from polykv_search.io import write_json  # noqa: E402
from polykv_search.patterns import PATTERNS  # noqa: E402
from polykv_search.runtime import apply_strategy  # noqa: E402
from strategies import Strategy  # noqa: E402
from tests.oracle import Oracle  # noqa: E402
from tests.test_eval_support import char_tokenizer  # noqa: E402
from tests.test_kvzip_pooled import held, oracle_held  # noqa: E402
from tests.test_runtime import batch, kept_sets, mixed_strategy  # noqa: E402
from tests.test_scoring_engines import entries, jobs, run_both  # noqa: E402
from tests.tiny import FAMILIES, tiny_model  # noqa: E402

EVICTING = [name for name, cls in PATTERNS.items() if not cls.keeps_all]
#: issue 26's cost comparison: the query-agnostic patterns against the first, side by side
PAIRED = ["snapkv", "kvzip", "kvzip[allocation=model]", "keydiff", "expected_attention"]
#: the layer shape of kvzip's prefill cost run, at full size and in --smoke (benchmarks/shape_model.py)
SHAPE = {False: "llama-3.1-8b", True: "smoke"}
#: KVzip's own allocation, the best uniform on ruler: heads of different lengths, one pool over the model
POOLED = Strategy.uniform(2, "kvzip", 10, params={"allocation": "model"})
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LOGIT_TOL = 1e-3  # fp32 on the device vs the fp32 CPU oracle


def kernels(device: str) -> list[str]:
    out = ["sdpa", "eager"]
    if device.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None:
        out.append("flash_attention_2")
    return out


def forced_run(model, strategy: Strategy, inputs: dict, runner) -> tuple[list[torch.Tensor], object]:
    """Prefill, one teacher-forced continuation call, then forced single-token steps, under ``runner``
    (the runtime or the oracle): the same inputs on both sides, so no greedy choice can make them part."""
    dev = next(model.parameters()).device
    ids, mask, cont, steps = (inputs[k].to(dev) for k in ("ids", "mask", "cont", "steps"))
    logits = []
    with runner(model, strategy) as ctx, torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True)
        cache = out.cache
        logits.append(out.logits.float().cpu())
        full = torch.cat([mask, torch.ones_like(cont)], 1)
        logits.append(model(cont, attention_mask=full, cache=cache, use_cache=True).logits.float().cpu())
        for t in range(steps.shape[1]):
            full = torch.cat([full, torch.ones_like(steps[:, t : t + 1])], 1)
            out = model(steps[:, t : t + 1], attention_mask=full, cache=cache, use_cache=True)
            logits.append(out.logits.float().cpu())
    return logits, (cache, ctx)


def oracle_case(family: str, strategy: Strategy, device: str, dtype: str, attn: str, inputs: dict) -> dict:
    reference = tiny_model(family, attn="eager" if attn == "flash_attention_2" else attn, layers=2, seed=4)
    model = copy.deepcopy(reference).to(device=device, dtype=DTYPES[dtype])
    if attn == "flash_attention_2":
        model.set_attn_implementation(attn)
    fast, (cache, _) = forced_run(model, strategy, inputs, apply_strategy)
    ref, (_, oracle) = forced_run(reference, strategy, inputs, Oracle)
    if any(getattr(layer, "positions", None) is None for layer in cache.layers):  # pooled: per-head lengths
        got = held(cache)
        sets = [(*cell, got[cell], want) for cell, want in oracle_held(oracle, cache).items()]
    else:
        sets = kept_sets(cache, oracle)
    real = inputs["mask"].bool()
    diff = max(
        float(((a - b).abs()[real] if i == 0 else (a - b).abs()).max()) for i, (a, b) in enumerate(zip(fast, ref))
    )
    return {"kept_equal": sum(got == want for *_, got, want in sets) / len(sets), "max_dlogit": diff}


def engines_case(family: str, device: str, dtype: str) -> dict:
    model = tiny_model(family, layers=3).to(device=device, dtype=DTYPES[dtype])
    same, diff = True, 0.0
    for job in jobs(char_tokenizer()):
        reference, shared = run_both(model, entries(), job)
        for ref, got in zip(reference, shared):
            same &= got.kv_bytes == ref.kv_bytes
            if job.teacher_forced:
                same &= got.pred["correct"] == ref.pred["correct"]
                diff = max(diff, float((got.logits.float() - ref.logits.float()).abs().max()))
            else:
                same &= got.new_ids == ref.new_ids
    return {"identical_predictions": bool(same), "max_dlogit": diff}


def exactness(device: str, smoke: bool) -> list[dict]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator().manual_seed(6)
    ids, mask = batch(seed=5, n=30, pad=4)
    inputs = {"ids": ids, "mask": mask, "cont": torch.randint(1, 128, (2, 4), generator=gen)}
    inputs["steps"] = torch.randint(1, 128, (2, 7), generator=gen)
    families = FAMILIES[:1] if smoke else FAMILIES
    dtypes = ["fp32"] if smoke else list(DTYPES)
    strategies = {"mixed": mixed_strategy(2), "kvzip[allocation=model]": POOLED}
    for p in EVICTING[:1] if smoke else EVICTING:
        params = {"window": 4} if "window" in PATTERNS[p]().params() else None
        strategies[p] = Strategy.uniform(2, p, 10, params=params)
    rows = []
    for family in families:
        for dtype in dtypes:
            for attn in kernels(device)[:1] if smoke else kernels(device):
                for name, strategy in strategies.items():
                    r = oracle_case(family, strategy, device, dtype, attn, inputs)
                    ok = dtype != "fp32" or (r["kept_equal"] == 1.0 and r["max_dlogit"] <= LOGIT_TOL)
                    where = {"family": family, "dtype": dtype, "attn": attn, "strategy": name}
                    rows.append({"check": "oracle", **where, **r, "ok": ok})
            r = engines_case(family, device, dtype)
            where = {"family": family, "dtype": dtype, "attn": "sdpa", "strategy": "entries"}
            rows.append({"check": "engines", **where, **r, "ok": dtype != "fp32" or r["identical_predictions"]})
    return rows


def speed(device: str, smoke: bool, out: Path) -> dict:
    """Run the benchmark scripts on the device; their JSON lands in ``out``. Each run's ``ok``: it exited 0 and
    wrote its output. The scripts run in the checkout, so every path they are given is absolute."""
    out = Path(out).resolve()
    if smoke:
        runtime_args = ["--contexts", "128", "--budget", "32", "--decode-steps", "2", "--repeats", "1"]
        runtime_args += ["--intervals", "1"]
        score_args = ["--contexts", "128", "--budget", "32", "--suite", "broad/continuation", "--shared-only"]
    else:
        runtime_args = [
            "--contexts",
            "4096,8192,16384",
            "--decode-steps",
            "64",
            "--repeats",
            "2",
            "--intervals",
            "1,16",
        ]
        score_args = ["--contexts", "4096,8192", "--suite", "broad,ruler"]
    patterns_args = ["--pattern", ",".join(PAIRED), "--paired-to", PAIRED[0], "--intervals", "1"]
    patterns_args += (
        ["--contexts", "128", "--budget", "32", "--decode-steps", "2", "--repeats", "3"]
        if smoke
        else ["--contexts", "4096", "--decode-steps", "64", "--repeats", "4"]
    )
    # kvzip's prefill where the MLPs dominate: two layers of an 8B model's shape, random weights (the issue's ~2×)
    shape = out / f"shape-{SHAPE[smoke]}"
    shape_args = ["--model", str(shape), "--pattern", "snapkv,kvzip", "--paired-to", "snapkv", "--intervals", "1"]
    shape_args += patterns_args[patterns_args.index("--contexts") :]
    result = {}
    runs = (  # (result name, script, arguments); shape_model writes the checkpoint the last run reads
        ("bench_runtime", "bench_runtime", ["--device", device, *runtime_args]),
        ("bench_score", "bench_score", ["--device", device, *score_args]),
        ("bench_runtime_patterns", "bench_runtime", ["--device", device, *patterns_args]),
        ("shape_model", "shape_model", ["--shape", SHAPE[smoke], "--layers", "2"]),
        ("bench_runtime_shape", "bench_runtime", ["--device", device, *shape_args]),
    )
    for name, script_name, args in runs:
        target = shape if name == "shape_model" else out / f"{name}.json"
        if name == "shape_model" and target.exists():  # a rerun reuses the checkpoint
            result[name] = {"command": "(reused)", "rc": 0, "seconds": 0.0, "json": None, "error": None, "ok": True}
            continue
        script = ROOT / "benchmarks" / f"{script_name}.py"
        cmd = [sys.executable, str(script), *args, "--out", str(target)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wrote = target.exists()
        error = proc.stderr.strip().splitlines()[-1] if proc.returncode and proc.stderr.strip() else None
        result[name] = {
            "command": " ".join(cmd[1:]),
            "rc": proc.returncode,
            "seconds": round(time.perf_counter() - start, 1),
            "json": str(target) if wrote and name != "shape_model" else None,
            "error": error or (None if wrote else f"wrote nothing at {target}"),
            "ok": proc.returncode == 0 and wrote,
        }
    return result


def speed_lines(result: dict) -> list[str]:
    """The headline figures of each benchmark's JSON (or why it is missing)."""
    lines = []
    for name, r in result.items():
        if name == "shape_model" and r["ok"]:
            lines.append(f"shape_model: {r['seconds']} s ({r['command']})")
            continue
        if not r["json"]:
            lines.append(f"{name}: failed (rc {r['rc']}): {r['error']}")
            continue
        doc = json.loads(Path(r["json"]).read_text())
        for ctx, c in doc["contexts"].items():
            if name in ("bench_runtime_patterns", "bench_runtime_shape"):
                pairs = c.get("paired", {})
                base = next(iter(pairs.values()))["vs"] if pairs else PAIRED[0]
                lines.append(f"{name} {ctx}: over {base}, decode speed, then prefill time:")
                width = max((len(k.split()[0]) for k in pairs), default=0)
                for k, v in pairs.items():
                    decode, prefill = (runtime_pairs.text(v[part]) for part in ("decode", "prefill"))
                    lines.append(f"  {k.split()[0]:{width}s}  {decode:21s} {prefill}")
            elif name == "bench_runtime":
                parts = [f"{k} {v['decode_speedup']:.2f}x" for k, v in c.items() if k not in ("unmodified", "paired")]
                lines.append(f"{name} {ctx}: decode vs unmodified: " + ", ".join(parts))
            elif c.get("speedup_wall") is None:
                lines.append(f"{name} {ctx}: shared engine wall {c['runs']['shared'][0]['wall_s']:.1f} s (shared only)")
            else:
                ceiling = c["ceiling"]["ratio"]
                lines.append(
                    f"{name} {ctx}: shared engine {c['speedup_wall']:.1f}x per-entry (ceiling {ceiling:.1f}x), "
                    f"scores identical: {c['scores_identical']}"
                )
        lines.append(f"  ({r['seconds']} s: python {r['command']})")
    return lines


def summary_lines(rows: list[dict]) -> list[str]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["check"], r["dtype"], r["attn"]), []).append(r)
    lines = []
    for (check, dtype, attn), rs in groups.items():
        worst = max(r["max_dlogit"] for r in rs)
        detail = (
            f"kept sets equal {min(r['kept_equal'] for r in rs):.3f} (worst case)"
            if check == "oracle"
            else f"identical predictions {sum(r['identical_predictions'] for r in rs)}/{len(rs)} families"
        )
        ok = sum(r["ok"] for r in rs)
        lines.append(f"{check:7s} {dtype} {attn:17s} {ok}/{len(rs)} ok; {detail}; max |dlogit| {worst:.2e}")
    return lines


def check_device(device: str) -> str | None:
    """Why ``device`` cannot run the check (one line), or None."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        return f"--device {device!r}: not a torch device (cpu, cuda, cuda:N, ...)"
    if dev.type == "cpu":
        return None
    backend = getattr(torch, dev.type, None)
    if not getattr(backend, "is_available", lambda: False)():
        return f"--device {device}, but torch sees no {dev.type.upper()} device"
    count = getattr(backend, "device_count", lambda: 1)()
    if dev.index is not None and dev.index >= count:
        return f"--device {device}, but torch sees {count} {dev.type.upper()} device(s) (0..{count - 1})"
    return None


def check_out(out: Path) -> str | None:
    """Why the folder ``out`` cannot be written (one line), or None; creates nothing."""
    if out.exists():
        if not out.is_dir():
            return f"--out {out}: exists and is not a folder"
        return None if os.access(out, os.W_OK) else f"--out {out}: folder is not writable"
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is not a folder"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"--out {out}: cannot create it in {parent}"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="gpu_check.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--smoke", action="store_true", help="a few cases and 256-token benchmarks (CPU, seconds)")
    ap.add_argument("--no-speed", action="store_true", help="exactness only")
    ap.add_argument("--out", default="runs/gpu_check")
    try:
        args = ap.parse_args(argv)
    except UsageError as err:  # one line, not argparse's usage block
        print(f"error: {err}", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out).expanduser().resolve()  # the benchmarks run in the checkout: give them absolute paths
    problem = check_device(device) or check_out(out)
    if problem:  # before anything is created
        print(f"error: {problem}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else device
    start = time.perf_counter()
    rows = exactness(device, args.smoke)
    speed_result = {} if args.no_speed else speed(device, args.smoke, out)
    lines = [f"device check on {name} (torch {torch.__version__}), {time.perf_counter() - start:.0f} s", ""]
    lines += summary_lines(rows) + [""] + speed_lines(speed_result)
    failed = [r for r in rows if not r["ok"]]
    broken = [n for n, r in speed_result.items() if not r["ok"]]
    lines.append("")
    if failed or broken:
        lines.append(f"{len(failed)} asserted check(s) and {len(broken)} benchmark run(s) failed")
    else:
        lines.append("every asserted check passed" + (", every benchmark ran" if speed_result else ""))
    write_json(out / "summary.json", {"device": name, "exactness": rows, "speed": speed_result, "lines": lines})
    print("\n".join(lines))
    return 1 if failed or broken else 0


if __name__ == "__main__":
    from polykv_search.cli import run_script

    run_script(main)
