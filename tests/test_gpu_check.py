"""``benchmarks/gpu_check.py`` cannot rot: its CPU smoke mode runs here (the exactness part in the default
run and CI; the 128-token benchmarks on SmolLM2 and a small shape model with ``pytest -m slow``, about two minutes)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.parametrize(
    "argv",
    [
        ["--device", "nosuch"],
        ["--device", "cuda:99"],
        ["--out", "a-file"],
        ["--out", "a-file/below"],
        ["--bad-flag"],
        ["--smok"],  # an abbreviation of --smoke would run the full check (minutes), not the smoke one
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(gpu_check, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("kept")
    if "--out" not in argv:
        argv = [*argv, "--out", "new-folder"]
    assert gpu_check.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and (tmp_path / "a-file").read_text() == "kept"


def test_a_bad_flag_from_the_shell_is_one_line_not_the_usage_block(tmp_path):
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    proc = subprocess.run([sys.executable, str(script), "--no-such-flag"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: gpu_check.py: unrecognized arguments: --no-such-flag (see `gpu_check.py --help`)\n"


def _fake_benchmarks(monkeypatch, gpu_check, checkout: Path, writes: bool) -> list[list[str]]:
    """The benchmark scripts replaced by children that write ``{"contexts": {}}`` to their ``--out`` (resolved
    against their working directory, as a real script's is) when ``writes``, and exit 0 either way."""
    seen = []

    def run(cmd, cwd, **kwargs):
        seen.append(cmd)
        target = Path(cwd) / cmd[cmd.index("--out") + 1]
        if writes:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.name.startswith("shape-"):
                target.mkdir()
            else:
                target.write_text(json.dumps({"contexts": {}}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gpu_check, "ROOT", checkout)
    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    monkeypatch.setattr(gpu_check, "exactness", lambda device, smoke: [])
    return seen


def test_a_relative_out_gets_every_benchmarks_json_and_leaves_the_checkout_alone(gpu_check, tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(tmp_path)
    seen = _fake_benchmarks(monkeypatch, gpu_check, checkout, writes=True)
    assert gpu_check.main(["--smoke", "--device", "cpu", "--out", "rel/check"]) == 0
    assert list(checkout.iterdir()) == []  # nothing written where the scripts run
    assert all(Path(cmd[cmd.index("--out") + 1]).is_absolute() for cmd in seen)
    doc = json.loads((tmp_path / "rel" / "check" / "summary.json").read_text())
    assert all(r["ok"] and r["error"] is None for r in doc["speed"].values()) and len(doc["speed"]) == 5
    assert doc["lines"][-1] == "every asserted check passed, every benchmark ran"


def test_a_benchmark_that_exits_0_without_its_json_fails_the_run(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _fake_benchmarks(monkeypatch, gpu_check, tmp_path / "checkout", writes=False)
    assert gpu_check.main(["--smoke", "--device", "cpu", "--out", "rel"]) == 1
    out = capsys.readouterr().out
    assert "bench_runtime: failed (rc 0): wrote nothing at " + str(tmp_path / "rel" / "bench_runtime.json") in out
    assert "None" not in out and out.rstrip().endswith("0 asserted check(s) and 5 benchmark run(s) failed")


@pytest.mark.slow
def test_smoke_benchmarks_run_on_smollm2(gpu_check, tmp_path):
    result = gpu_check.speed("cpu", True, tmp_path)
    assert [r["rc"] for r in result.values()] == [0, 0, 0, 0, 0] and all(r["ok"] for r in result.values()), result
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
