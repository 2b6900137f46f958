"""The lm-evaluation-harness integration, offline: local task YAMLs over a jsonl file written here, on a
random-init tiny Llama (and one slow SmolLM2 test).

What is proven: FullKV through the ``polykv`` model gives lm-eval's plain ``hf`` model's results on the
same requests; a strategy that evicts almost everything changes the loglikelihoods; a loglikelihood
request is a context call then a continuation call; KV bytes land in lm-eval's results; ``score
--lm-eval-tasks`` folds per-document scores into a results file that ``compare`` reads with intervals.
"""

from __future__ import annotations

import json
import math

import pytest

lm_eval = pytest.importorskip("lm_eval")  # in the test extra; skipped only where it is not installed

from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from polykv_search import compare as cmp  # noqa: E402
from polykv_search.cli import main  # noqa: E402
from polykv_search.integrations.lm_eval_model import PolyKVLM  # noqa: E402
from strategies import Strategy, StrategyError  # noqa: E402
from tests.test_eval_support import char_tokenizer  # noqa: E402
from tests.tiny import tiny_model  # noqa: E402

N_DOCS = 4
MC_TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
GEN_TASK = """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(autouse=True)
def no_env_report(monkeypatch):
    """lm-eval's results carry torch's environment report (``torch.utils.collect_env``: ~3 s of
    subprocesses per evaluation on 2 cores); these tests never read it."""
    import lm_eval.evaluator

    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny Llama checkpoint with a char tokenizer, a jsonl of documents and two task YAMLs."""
    root = tmp_path_factory.mktemp("lm-eval")
    ckpt = root / "tiny-llama"
    tiny_model("llama", layers=2).save_pretrained(ckpt)
    char_tokenizer().save_pretrained(ckpt)
    words = "the quick brown fox jumps over the lazy dog while seven pale owls watch the river "
    docs = [
        {"context": f"{words * 2}item {i}:", "choices": ["alpha", "beta", "gamma"], "label": i % 3, "answer": " a"}
        for i in range(N_DOCS)
    ]
    data = root / "docs.jsonl"
    data.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "tiny_mc.yaml").write_text(MC_TASK.format(data=data))
    (tasks / "tiny_gen.yaml").write_text(GEN_TASK.format(data=data))
    return {"ckpt": ckpt, "tasks": tasks, "manager": TaskManager(include_path=str(tasks), include_defaults=False)}


def evaluate(work, lm, tasks=("tiny_mc", "tiny_gen")) -> dict:
    return lm_eval.simple_evaluate(
        model=lm, tasks=list(tasks), task_manager=work["manager"], limit=N_DOCS, log_samples=True, bootstrap_iters=0
    )


def responses(results: dict, task: str) -> list:
    return [s["resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def test_fullkv_equals_hf_and_near_total_eviction_changes_loglikelihoods(work):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(work["ckpt"], dtype="float32").eval()
    tok = AutoTokenizer.from_pretrained(work["ckpt"])
    plain = evaluate(work, HFLM(pretrained=model, tokenizer=tok))
    full = evaluate(work, PolyKVLM(pretrained=model, tokenizer=tok))
    # the model type by name, from a path (lm-eval's own loader), with a strategy keeping 2 tokens of ~180
    evicted = lm_eval.simple_evaluate(
        model="polykv",
        model_args={"pretrained": str(work["ckpt"]), "strategy": "uniform:streaming_llm", "budget": 2, "device": "cpu"},
        tasks=["tiny_mc", "tiny_gen"],
        task_manager=work["manager"],
        limit=N_DOCS,
        log_samples=True,
        bootstrap_iters=0,
    )

    ll = lambda r: [x for doc in responses(r, "tiny_mc") for [(x, _)] in doc]  # noqa: E731
    greedy = lambda r: [g for doc in responses(r, "tiny_mc") for [(_, g)] in doc]  # noqa: E731
    assert len(ll(plain)) == 3 * N_DOCS
    assert ll(full) == pytest.approx(ll(plain), abs=1e-4) and greedy(full) == greedy(plain)
    assert responses(full, "tiny_gen") == responses(plain, "tiny_gen")
    assert full["results"]["tiny_mc"]["acc,none"] == plain["results"]["tiny_mc"]["acc,none"]
    assert max(abs(a - b) for a, b in zip(ll(evicted), ll(plain))) > 1e-2

    # KV bytes held per request, overall and per task, in the config block of lm-eval's results
    kv_full, kv_evicted = full["config"]["polykv"], evicted["config"]["polykv"]
    assert kv_full["requests"] == 4 * N_DOCS and kv_full["kv_ratio"] == 1.0
    assert kv_full["kv_bytes"] == kv_full["full_kv_bytes"] == evicted["config"]["polykv"]["full_kv_bytes"]
    assert kv_evicted["strategy"] == "uniform-streaming_llm" and kv_evicted["global_budget"] == 2.0
    assert 0 < kv_evicted["kv_ratio"] < 0.1
    assert (
        kv_evicted["tasks"]["tiny_mc"]["requests"] == 3 * N_DOCS
        and kv_evicted["tasks"]["tiny_gen"]["requests"] == N_DOCS
    )
    assert "continuation" in kv_evicted["protocol"]
    json.dumps(lm_eval.utils.handle_non_serializable(kv_evicted))  # the block goes into lm-eval's results file


def test_a_loglikelihood_request_is_a_context_call_then_a_continuation_call(work):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(work["ckpt"], dtype="float32").eval()
    lm = PolyKVLM(
        pretrained=model, tokenizer=AutoTokenizer.from_pretrained(work["ckpt"]), strategy=Strategy.uniform(2, "h2o", 3)
    )
    calls: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        context, continuation = list(range(4, 40)), [50, 51, 52, 53]
        ((logprob, greedy),) = lm._loglikelihood_tokens([(None, context, continuation)])
    finally:
        hook.remove()
    assert calls == [len(context), len(continuation) - 1]  # compressed between the two calls
    assert math.isfinite(logprob) and logprob < 0 and isinstance(greedy, bool)
    assert lm.kv_log[-1].kv_bytes < lm.kv_log[-1].full_kv_bytes
    with pytest.raises(StrategyError, match="needs budget"):
        PolyKVLM(pretrained=model, tokenizer=lm.tokenizer, strategy="uniform:snapkv")
    with pytest.raises(StrategyError, match="layers"):
        PolyKVLM(pretrained=model, tokenizer=lm.tokenizer, strategy=Strategy.full(5))


def test_score_folds_lm_eval_tasks_into_results_that_compare_reads(work, tmp_path, capsys):
    out = tmp_path / "results.json"
    argv = [
        "score",
        "--model",
        str(work["ckpt"]),
        "--baseline",
        "full",
        "--baseline",
        "uniform:streaming_llm",
        "--budget",
        "2",
        "--suite",
        "none",
        "--lm-eval-tasks",
        "tiny_mc,tiny_gen:exact_match",
        "--lm-eval-include-path",
        str(work["tasks"]),
        "--samples",
        str(N_DOCS),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    doc = cmp.load_results(out)
    full, evicted = doc["entries"]
    assert set(full["scores"]) == {"lm-eval/tiny_mc", "lm-eval/tiny_gen"} and set(full["suites"]) == {"lm-eval"}
    for name in full["scores"]:
        ids = [r["id"] for r in full["tasks"][name]["per_sample"]]
        assert ids == [r["id"] for r in evicted["tasks"][name]["per_sample"]] == [str(i) for i in range(N_DOCS)]
        assert all(r["score"] in (0.0, 100.0) for r in full["tasks"][name]["per_sample"])
        assert doc["provenance"]["tasks"][name]["suite"] == "lm-eval"
    assert full["kv_ratio"] == 1.0 and 0 < evicted["kv_ratio"] < 0.1
    assert evicted["extra"]["lm-eval/tiny_mc"]["kv_ratio"] < 0.1
    assert evicted["lm_eval"]["polykv"]["requests"] == 4 * N_DOCS
    assert (
        doc["provenance"]["lm_eval"]["version"] == lm_eval.__version__
        and doc["provenance"]["lm_eval"]["limit"] == N_DOCS
    )
    c = cmp.compare([doc], resamples=200)
    assert all(r.suite_iv["lm-eval"].n == 2 * N_DOCS for r in c.rows)  # paired intervals over both tasks' documents
    capsys.readouterr()
    assert main(["compare", str(out), "--resamples", "200"]) == 0
    assert "lm-eval" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--lm-eval-tasks", "tiny_mc", "--lm-eval-include-path", "/no/such/folder"], "not a folder"),
        (["--lm-eval-include-path", "."], "needs --lm-eval-tasks"),
        (["--lm-eval-tasks", "tiny_mc,,tiny_gen"], "empty task name"),
    ],
)
def test_bad_lm_eval_options_are_one_line_before_the_model_loads(work, tmp_path, capsys, extra, message):
    argv = [
        "score",
        "--model",
        str(tmp_path / "no-such-model"),
        "--baseline",
        "full",
        "--suite",
        "none",
        "--out",
        str(tmp_path / "r.json"),
        *extra,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_smollm2_default_model_fullkv_equals_hf_and_snapkv_holds_less(tmp_path):
    data = tmp_path / "docs.jsonl"
    text = "Elizabeth walked to Netherfield through the muddy fields, and arrived with her petticoat six inches deep. "
    data.write_text(
        "\n".join(
            json.dumps(
                {
                    "context": f"{text * 4}Question {i}: the colour of the mud was",
                    "choices": [" brown", " blue", " green"],
                    "label": 0,
                    "answer": " brown",
                }
            )
            for i in range(2)
        )
    )
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mc.yaml").write_text(MC_TASK.format(data=data))
    work = {"manager": TaskManager(include_path=str(tasks), include_defaults=False)}
    full = PolyKVLM(device="cpu")  # pretrained defaults to smollm2-135m, from the local cache
    plain = evaluate(work, HFLM(pretrained=full.model, tokenizer=full.tokenizer), ("tiny_mc",))
    ours = evaluate(work, full, ("tiny_mc",))
    snapkv = PolyKVLM(pretrained=full.model, tokenizer=full.tokenizer, strategy="uniform:snapkv", budget=16)
    snap = evaluate(work, snapkv, ("tiny_mc",))
    ll = lambda r: [x for doc in responses(r, "tiny_mc") for [(x, _)] in doc]  # noqa: E731
    assert ll(ours) == pytest.approx(ll(plain), abs=1e-3)
    assert ll(snap) != pytest.approx(ll(plain), abs=1e-3)
    assert ours["config"]["polykv"]["kv_ratio"] == 1.0 and snap["config"]["polykv"]["kv_ratio"] < 0.5


@pytest.mark.slow
def test_polykv_lm_eval_is_lm_evals_cli_with_polykv_registered(work, tmp_path, capsys):
    """Slow only because lm-eval's CLI indexes its thousands of built-in task YAMLs (~5 s a run)."""
    from polykv_search.integrations.lm_eval_cli import main as lm_eval_main

    common = ["--tasks", "tiny_mc", "--include_path", str(work["tasks"]), "--limit", "2"]
    args = f"pretrained={work['ckpt']},strategy=uniform:h2o,budget=3,decode_interval=2"  # no device: cpu here
    assert (
        lm_eval_main(
            [
                "--model",
                "polykv",
                "--model_args",
                args,
                *common,
                "--output_path",
                str(tmp_path / "out"),
                "--log_samples",
            ]
        )
        == 0
    )
    (results,) = (tmp_path / "out").rglob("results_*.json")
    saved = json.loads(results.read_text())
    assert saved["config"]["model"] == "polykv" and saved["config"]["polykv"]["decode_interval"] == 2
    assert 0 < saved["config"]["polykv"]["kv_ratio"] < 1 and list((tmp_path / "out").rglob("samples_tiny_mc_*.jsonl"))
    capsys.readouterr()
    bad = f"pretrained={work['ckpt']},strategy={tmp_path / 'missing.json'}"
    assert lm_eval_main(["--model", "polykv", "--model_args", bad, *common]) == 2
    err = capsys.readouterr().err
    assert "missing.json" in err and "Traceback" not in err


def test_kvzip_runs_through_the_model_type_with_lm_evals_tokenizer(work):
    # lm-eval loads the model itself: kvzip's repeat prompts come from lm-eval's tokenizer
    out = lm_eval.simple_evaluate(
        model="polykv",
        model_args={"pretrained": str(work["ckpt"]), "strategy": "uniform:kvzip", "budget": 8, "device": "cpu"},
        tasks=["tiny_mc"],
        task_manager=work["manager"],
        limit=N_DOCS,
        log_samples=True,
        bootstrap_iters=0,
    )
    kv = out["config"]["polykv"]
    assert kv["strategy"] == "uniform-kvzip" and kv["requests"] == 3 * N_DOCS
    assert 0 < kv["kv_ratio"] < 1
