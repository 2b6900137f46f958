"""LongBench: local jsonl fixtures, the hf: path, prompt templates, truncation and scoring."""

from __future__ import annotations

import json
import sys
import types

import pytest

from polykv_search.evaluation import LongBenchDataError, encode_prompt, get_task, load_longbench, prompt_length
from polykv_search.evaluation.longbench import PROMPTS, split_prompt
from tests.test_eval_support import char_tokenizer

TOK = char_tokenizer()
CHAT_TOK = char_tokenizer(chat=True)

HOTPOT = [
    {
        "input": "Which city is the capital of France?",
        "context": "Passage 1:\nParis is the capital of France.\nPassage 2:\nBerlin is the capital of Germany.",
        "answers": ["Paris"],
        "length": 14,
        "all_classes": None,
        "dataset": "hotpotqa",
        "_id": "h1",
    },
    {
        "input": "Who wrote Emma?",
        "context": "Passage 1:\nEmma is a novel by Jane Austen.",
        "answers": ["Jane Austen"],
        "length": 8,
        "all_classes": None,
        "dataset": "hotpotqa",
        "_id": "h2",
    },
    {
        "input": "What colour is the sky?",
        "context": "Passage 1:\nThe sky is blue. " * 40,
        "answers": ["blue"],
        "length": 200,
        "all_classes": None,
        "dataset": "hotpotqa",
        "_id": "h3",
    },
]
TREC = [
    {
        "input": "Question: Where is Lyon?\nType:",
        "context": "Question: Who is Emma?\nType: Individual\n",
        "answers": ["Location"],
        "length": 9,
        "all_classes": ["Location", "Individual", "City"],
        "dataset": "trec",
        "_id": "t1",
    },
]
LCC = [
    {
        "input": "",
        "context": "def add(a, b):\n",
        "answers": ["    return a + b"],
        "length": 3,
        "all_classes": None,
        "dataset": "lcc",
        "_id": "c1",
    }
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data_dir(tmp_path):
    write_jsonl(tmp_path / "hotpotqa.jsonl", HOTPOT)
    write_jsonl(tmp_path / "trec.jsonl", TREC)
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "lcc.jsonl", LCC)
    write_jsonl(tmp_path / "mixed.jsonl", HOTPOT + TREC)
    return tmp_path


def test_loads_a_jsonl_file_a_directory_or_its_data_folder(data_dir):
    assert [r["_id"] for r in load_longbench(data_dir / "hotpotqa.jsonl", "hotpotqa")] == ["h1", "h2", "h3"]
    assert [r["_id"] for r in load_longbench(data_dir, "trec")] == ["t1"]
    assert [r["_id"] for r in load_longbench(data_dir, "lcc")] == ["c1"]
    # A file mixing datasets keeps the rows of the one asked for.
    assert [r["_id"] for r in load_longbench(data_dir / "mixed.jsonl", "trec")] == ["t1"]


def test_bad_data_is_a_clear_error(data_dir, tmp_path):
    with pytest.raises(LongBenchDataError, match="no qasper.jsonl"):
        load_longbench(data_dir, "qasper")
    with pytest.raises(LongBenchDataError, match="lacks answers"):
        load_longbench(write_jsonl(tmp_path / "bad.jsonl", [{"input": "q", "context": "c"}]), "hotpotqa")
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    with pytest.raises(LongBenchDataError, match="not JSON"):
        load_longbench(tmp_path / "broken.jsonl", "hotpotqa")
    with pytest.raises(LongBenchDataError, match="unknown LongBench dataset"):
        load_longbench(data_dir, "nope")
    with pytest.raises(LongBenchDataError, match="no such file"):
        load_longbench(tmp_path / "missing.jsonl", "hotpotqa")


def test_hf_specs_go_through_datasets_with_config_split_and_fallback(monkeypatch):
    calls = []

    def load_dataset(name, config=None, **kwargs):
        calls.append((name, config, kwargs["split"]))
        if config == "hotpotqa" and name == "one/table":
            raise ValueError("BuilderConfig 'hotpotqa' not found. Available: ['default']")
        return HOTPOT + TREC

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert len(load_longbench("hf:THUDM/LongBench", "hotpotqa")) == 3
    assert len(load_longbench("hf:my/mirror:cfg:validation", "trec")) == 1
    assert len(load_longbench("hf:one/table", "hotpotqa")) == 3  # default config, filtered
    assert calls == [
        ("THUDM/LongBench", "hotpotqa", "test"),
        ("my/mirror", "cfg", "validation"),
        ("one/table", "hotpotqa", "test"),
        ("one/table", None, "test"),
    ]
    with pytest.raises(LongBenchDataError, match="bad hf spec"):
        load_longbench("hf:", "hotpotqa")


def test_prompts_split_after_the_context_so_the_question_is_never_compressed():
    context, question = split_prompt("hotpotqa", "CTX", "Q?")
    assert context.endswith("The following are given passages.\nCTX")
    assert (
        question == "\n\nAnswer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nQuestion: Q?\nAnswer:"
    )
    assert (
        "".join(split_prompt("lcc", "code\n", ""))
        == "Please complete the code given below. \ncode\nNext line of code:\n"
    )
    assert set(PROMPTS) >= {
        "narrativeqa",
        "qasper",
        "hotpotqa",
        "2wikimqa",
        "gov_report",
        "trec",
        "triviaqa",
        "lcc",
        "repobench-p",
        "passage_count",
    }


def test_task_samples_follow_the_seed_and_use_the_chat_template_like_longbench(data_dir):
    task = get_task("longbench/hotpotqa", source=str(data_dir))
    a = task.generate(CHAT_TOK, None, 2, 4000, seed=0)
    assert [s.to_dict() for s in a] == [s.to_dict() for s in task.generate(CHAT_TOK, None, 2, 4000, seed=0)]
    assert {s.meta["_id"] for s in task.generate(CHAT_TOK, None, 3, 4000, seed=0)} == {"h1", "h2", "h3"}
    assert all(s.chat for s in a) and task.max_new_tokens == 32
    c, _ = encode_prompt(CHAT_TOK, a[0])
    assert CHAT_TOK.decode(c).startswith("<s><|user|>\nAnswer the question")
    trec = get_task("longbench/trec", source=str(data_dir)).generate(CHAT_TOK, None, 1, 4000, seed=0)[0]
    assert not trec.chat and trec.meta["all_classes"] == ["Location", "Individual", "City"]
    c, q = encode_prompt(CHAT_TOK, trec)
    assert "<|user|>" not in CHAT_TOK.decode(c + q)


def test_a_long_context_is_cut_in_the_middle_to_fit(data_dir):
    task = get_task("longbench/hotpotqa", source=str(data_dir / "hotpotqa.jsonl"))
    long = next(s for s in task.generate(TOK, None, 3, 400, seed=0) if s.meta["_id"] == "h3")
    assert long.meta["truncated"] and 392 <= prompt_length(TOK, long) <= 400
    assert "Passage 1:\nThe sky" in long.context and long.context.endswith("The sky is blue. ")
    short = next(s for s in task.generate(TOK, None, 3, 400, seed=0) if s.meta["_id"] == "h1")
    assert not short.meta["truncated"] and HOTPOT[0]["context"] in short.context
    with pytest.raises(ValueError, match="cannot hold"):
        task.generate(TOK, None, 3, 100, seed=0)


def test_scores_use_the_dataset_metric(data_dir):
    hot = get_task("longbench/hotpotqa", source=str(data_dir))
    samples = sorted(hot.generate(TOK, None, 3, 4000, seed=0), key=lambda s: s.meta["_id"])
    assert hot.score(["Paris.", "Austen", "green"], samples) == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)
    trec = get_task("longbench/trec", source=str(data_dir))
    (t,) = trec.generate(TOK, None, 1, 4000, seed=0)
    assert trec.score(["Location\nCity"], [t]) == 100.0
    lcc = get_task("longbench/lcc", source=str(data_dir))
    (c,) = lcc.generate(TOK, None, 1, 4000, seed=0)
    assert lcc.score(["```\n    return a + b\n"], [c]) == 100.0


@pytest.mark.slow
def test_hf_spec_loads_a_local_dataset_directory_through_datasets(tmp_path):
    folder = tmp_path / "longbench"
    folder.mkdir()
    write_jsonl(folder / "test.jsonl", HOTPOT + TREC)
    rows = load_longbench(f"hf:{folder}", "trec", cache_dir=str(tmp_path / "cache"))
    assert [r["_id"] for r in rows] == ["t1"] and rows[0]["answers"] == ["Location"]
