"""``benchmarks/gpu_check.py`` cannot rot: its CPU smoke mode runs here (the exactness part in the default
run and CI; the 128-token benchmarks on SmolLM2 and a small shape model with ``pytest -m slow``, about two minutes)."""

from __future__ import annotations

import json
import re

import pytest


def test_smoke_exactness_on_cpu_passes_and_writes_a_summary(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--smoke", "--no-speed", "--device", "cpu", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    checks = {(r["check"], r["strategy"]) for r in doc["exactness"]}
    assert ("engines", "entries") in checks and ("oracle", "mixed") in checks
    assert ("oracle", "kvzip[allocation=model]") in checks  # KVzip's pool: heads of different lengths
    assert all(r["ok"] for r in doc["exactness"])
    oracle = [r for r in doc["exactness"] if r["check"] == "oracle"]
    assert all(r["kept_equal"] == 1.0 and r["max_dlogit"] <= gpu_check.LOGIT_TOL for r in oracle)
    assert "every asserted check passed" in capsys.readouterr().out


def test_a_missing_cuda_device_is_one_line_exit_2(gpu_check, tmp_path, capsys):
    if gpu_check.torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--device", "cuda", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_smoke_benchmarks_run_on_smollm2(gpu_check, tmp_path):
    result = gpu_check.speed("cpu", True, tmp_path)
    assert [r["rc"] for r in result.values()] == [0, 0, 0, 0, 0], result
    lines = gpu_check.speed_lines(result)
    assert any(line.startswith("bench_runtime 128") for line in lines)
    assert any(line.startswith("bench_score 128: shared engine") for line in lines)
    at = lines.index("bench_runtime_patterns 128: over snapkv B32 k1, decode speed, then prefill time:")
    paired = lines[at + 1 : at + len(gpu_check.PAIRED)]  # each new pattern over snapkv, with intervals
    assert [line.split()[0] for line in paired] == gpu_check.PAIRED[1:], lines
    interval = re.compile(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]")
    assert all(len(interval.findall(line)) == 2 and len(line) <= 80 for line in paired), paired
    at = lines.index("bench_runtime_shape 128: over snapkv B32 k1, decode speed, then prefill time:")
    assert lines[at + 1].split()[0] == "kvzip" and len(interval.findall(lines[at + 1])) == 2
    assert (tmp_path / "shape-smoke" / "config.json").exists()
    again = gpu_check.speed("cpu", True, tmp_path)  # a rerun reuses the checkpoint
    assert again["shape_model"]["command"] == "(reused)" and again["bench_runtime_shape"]["rc"] == 0
