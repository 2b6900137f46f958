"""`polykv-search export`: files written, one-line errors with exit code 2, nothing written on refusal."""

from __future__ import annotations

import pytest

from polykv_search.cli import main
from strategies import LayerChoice, Strategy


def strategy_file(tmp_path, strategy=None):
    strategy = strategy or Strategy(
        [LayerChoice("full", 96), LayerChoice("streaming_llm", 64), LayerChoice("snapkv", 32)],
        [LayerChoice("full", 96), LayerChoice("streaming_llm", 64), LayerChoice("tova", 32)],
        global_budget=64,
        b_min=16,
        provenance={"solver": "test"},
    )
    path = tmp_path / "strategy.json"
    strategy.save(path)
    return path, strategy


def run(capsys, *argv):
    rc = main(["export", *map(str, argv)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_json_export_writes_the_canonical_file(tmp_path, capsys):
    src, strategy = strategy_file(tmp_path)
    rc, _, err = run(capsys, src, "--format", "json", "--out", tmp_path / "out" / "s.json")
    assert rc == 0
    assert (tmp_path / "out" / "s.json").read_text() == strategy.dumps()
    assert f"wrote {tmp_path / 'out' / 's.json'}: json, 3 layers" in err


def test_kvpress_export_writes_module_and_sidecar(tmp_path, capsys):
    src, _ = strategy_file(tmp_path)
    rc, _, err = run(capsys, src, "--format", "kvpress", "--out", tmp_path / "press.py")
    assert rc == 0
    assert (tmp_path / "press.py").read_text().startswith('"""kvpress press for a polykv-search strategy')
    assert '"schema": "polykv-kvpress-export"' in (tmp_path / "press.json").read_text()
    compile((tmp_path / "press.py").read_text(), "press.py", "exec")
    assert "note: kvpress differs: layer 2 decoding (tova): kvpress always keeps the newest token" in err
    assert f"(+ {tmp_path / 'press.json'})" in err


def files_in(path):
    return sorted(p.name for p in path.iterdir())


def test_refusal_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    src, _ = strategy_file(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "t.yaml").write_text("old\n")
    rc, stdout, err = run(capsys, src, "--format", "trtllm", "--out", out / "t.yaml", "--max-seq-len", 4096)
    assert rc == 2 and stdout == ""
    assert err.count("\n") == 1
    assert err.startswith(
        "error: trtllm cannot express layer 2 (prefill snapkv budget 32): TensorRT-LLM keeps only full"
    )
    assert files_in(out) == ["t.yaml"] and (out / "t.yaml").read_text() == "old\n"  # untouched, no temp files


def test_approximate_prints_a_warning_per_change(tmp_path, capsys):
    src, _ = strategy_file(tmp_path)
    rc, _, err = run(
        capsys, src, "--format", "trtllm", "--out", tmp_path / "t.yaml", "--max-seq-len", 4096, "--approximate"
    )
    assert rc == 0
    assert (
        "warning: approximated layer 2: snapkv budget 32 -> sliding window of 32 with the model's 4 sink tokens" in err
    )
    assert "warning: approximated layer 2: decoding tova budget 32 -> same as prefill" in err
    assert "trtllm, 3 layers, 2 approximations" in err
    assert "    - 32  # layer 2: snapkv budget 32\n" in (tmp_path / "t.yaml").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--format", "json", "--out", "s.json", "--max-seq-len", "10"],
            "error: --max-seq-len does not apply to --format json",
        ),
        (["--format", "kvpress", "--out", "press.txt"], "error: --out for --format kvpress must end in .py, got"),
        (
            ["--format", "vllm", "--out", "v.json"],
            "error: vllm cannot express layer 1 (prefill streaming_llm budget 64)",
        ),
        (
            ["--format", "trtllm", "--out", "t.yaml", "--approximate"],
            "error: trtllm needs --max-seq-len: layer 0 is full",
        ),
    ],
)
def test_bad_requests_exit_2_with_one_line(tmp_path, capsys, monkeypatch, args, message):
    src, _ = strategy_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(capsys, src, *args)
    assert rc == 2
    assert err.startswith(message) and err.count("\n") == 1, err
    assert files_in(tmp_path) == ["strategy.json"]


def test_bad_strategy_files_exit_2(tmp_path, capsys):
    rc, _, err = run(capsys, tmp_path / "missing.json", "--format", "json", "--out", tmp_path / "o.json")
    assert rc == 2 and err.startswith("error: strategy: cannot read")
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"schema": "polykv-strategy", "version": 1, "layers": [{"prefill": {"pattern": "nope", "budget": 1}, '
        '"decoding": {"pattern": "full", "budget": null}}]}'
    )
    rc, _, err = run(capsys, bad, "--format", "vllm", "--out", tmp_path / "o.json")
    assert rc == 2 and err.startswith(f"error: strategy {bad}: layers[0].prefill.pattern: unknown pattern 'nope'")
    assert files_in(tmp_path) == ["bad.json"]


def test_argparse_errors_and_help(tmp_path, capsys):
    src, _ = strategy_file(tmp_path)
    assert main(["export", str(src), "--format", "onnx", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'onnx'" in err and err.count("\n") == 1 and "see `polykv-search export --help`" in err
    assert main(["export", "--help"]) == 0
    assert "--approximate" in capsys.readouterr().out
