"""LongBench (v1, English datasets): loader, prompt templates and scoring.

Data is LongBench's jsonl format, one object per line with ``input``, ``context``, ``answers``,
``length``, ``all_classes``, ``dataset``, ``_id``. Sources (:func:`load_longbench`):

* a local ``.jsonl`` file (rows of other datasets, by their ``dataset`` field, are skipped);
* a local directory holding ``<dataset>.jsonl`` (or ``data/<dataset>.jsonl``, as in LongBench's
  ``data.zip``);
* ``hf:NAME[:CONFIG][:SPLIT]`` through ``datasets.load_dataset`` (CONFIG defaults to the dataset
  name, falling back to the default config filtered by the ``dataset`` column; SPLIT to ``test``).

Prompts are LongBench's ``dataset2prompt.json``, split for compression: everything up to and
including the ``{context}`` text is the context (compressed); the rest, with ``{input}`` and the
repeated instruction, is the question. As in LongBench's ``pred.py``, the chat template is used
except for the few-shot and code datasets (trec, triviaqa, samsum, lcc, repobench-p); a context
longer than ``context_len`` is cut in the middle (its first and last halves are kept).
Generation lengths are LongBench's ``dataset2maxlen.json``; scores its ``eval.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polykv_search.evaluation.base import SampleCheckError, Task, check_request, sample_rng
from polykv_search.evaluation.metrics import LONGBENCH_METRICS, longbench_score
from polykv_search.evaluation.samples import Sample, fit_to_length, prompt_length

PROMPTS: dict[str, str] = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
        "question as concisely as you can, using a single phrase if possible. Do not provide any "
        "explanation.\n\nStory: {context}\n\nNow, answer the question based on the story as concisely as you "
        "can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\n"
        "Answer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, using "
        "a single phrase or sentence if possible. If the question cannot be answered based on the information "
        'in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", '
        'or "unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question '
        "based on the above article as concisely as you can, using a single phrase or sentence if possible. If "
        'the question cannot be answered based on the information in the article, write "unanswerable". If '
        'the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any '
        "explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based "
        "on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\n"
        "Answer:"
    ),
    "hotpotqa": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
        "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "2wikimqa": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
        "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "musique": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
        "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n"
        "{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query "
        "in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above "
        "meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
        "Now, write a one-page summary of all the news.\n\nSummary:"
    ),
    "trec": (
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other "
        "words. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": (
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please "
        "carefully read these paragraphs and determine how many unique paragraphs there are after removing "
        "duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\n"
        "Please enter the final count of unique paragraphs after removing duplicates. The output format should "
        "only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number "
        'of the paragraph that the abstract is from. The answer format must be like "Paragraph 1", '
        '"Paragraph 2", etc.\n\nThe answer is: '
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

MAX_NEW_TOKENS: dict[str, int] = {
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "gov_report": 512,
    "qmsum": 512,
    "multi_news": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "lcc": 64,
    "repobench-p": 64,
}

#: Datasets LongBench prompts without the chat template.
NO_CHAT = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})

DATASETS = tuple(PROMPTS)
REQUIRED_FIELDS = ("input", "context", "answers")


class LongBenchDataError(ValueError):
    """Missing or malformed LongBench data."""


def split_prompt(dataset: str, context: str, query: str) -> tuple[str, str]:
    """LongBench's prompt for ``dataset`` as ``(context part, question part)``."""
    template = PROMPTS[dataset]
    cut = template.index("{context}") + len("{context}")
    head, tail = template[:cut], template[cut:]
    return head.replace("{context}", context), tail.replace("{input}", query)


# ----------------------------------------------------------------------------------- loading
def _validate(rows: list[dict], where: str) -> list[dict]:
    for i, row in enumerate(rows):
        missing = [f for f in REQUIRED_FIELDS if f not in row]
        if missing:
            raise LongBenchDataError(f"{where}: row {i} lacks {', '.join(missing)}")
        if isinstance(row["answers"], str):
            row["answers"] = [row["answers"]]
        if not isinstance(row["answers"], list):
            raise LongBenchDataError(f"{where}: row {i} 'answers' is not a list")
    return rows


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise LongBenchDataError(f"{path}:{n}: not JSON ({e.msg})") from None
    return rows


def _keep_dataset(rows: list[dict], dataset: str) -> list[dict]:
    return [r for r in rows if r.get("dataset") in (None, dataset)]


def load_longbench(source: str | Path, dataset: str, *, cache_dir: str | None = None) -> list[dict]:
    """Rows of LongBench ``dataset`` from ``source`` (see the module docstring)."""
    if dataset not in PROMPTS:
        raise LongBenchDataError(f"unknown LongBench dataset {dataset!r}; known: {', '.join(DATASETS)}")
    source = str(source)
    if source.startswith("hf:"):
        return _validate(_load_hf(source[3:], dataset, cache_dir), source)
    path = Path(source).expanduser()
    if path.is_dir():
        for candidate in (path / f"{dataset}.jsonl", path / "data" / f"{dataset}.jsonl"):
            if candidate.is_file():
                path = candidate
                break
        else:
            raise LongBenchDataError(f"{source}: no {dataset}.jsonl in this directory")
    elif not path.is_file():
        raise LongBenchDataError(f"{source}: no such file or directory")
    rows = _keep_dataset(_validate(_read_jsonl(path), str(path)), dataset)
    if not rows:
        raise LongBenchDataError(f"{path}: no rows of dataset {dataset!r}")
    return rows


def _load_hf(spec: str, dataset: str, cache_dir: str | None) -> list[dict]:
    import datasets  # only when asked for

    parts = spec.split(":")
    if not parts[0] or len(parts) > 3:
        raise LongBenchDataError(f"bad hf spec 'hf:{spec}'; use hf:NAME[:CONFIG][:SPLIT]")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else "test"
    kwargs: dict[str, Any] = {"split": split}
    if cache_dir is not None:
        kwargs["cache_dir"] = cache_dir
    try:
        if config is not None:
            ds = datasets.load_dataset(name, config, **kwargs)
        else:
            try:
                ds = datasets.load_dataset(name, dataset, **kwargs)
            except ValueError:  # no config named after the dataset: one table for all datasets
                ds = datasets.load_dataset(name, **kwargs)
    except LongBenchDataError:
        raise
    except Exception as e:  # network, missing config, bad split: one clear line
        raise LongBenchDataError(f"hf:{spec}: cannot load ({type(e).__name__}: {e})") from None
    rows = _keep_dataset([dict(r) for r in ds], dataset)
    if not rows:
        raise LongBenchDataError(f"hf:{spec}: no rows of dataset {dataset!r}")
    return rows


# --------------------------------------------------------------------------------------- task
class LongBenchTask(Task):
    """One LongBench dataset as a task; ``source`` says where its data is."""

    suite = "longbench"
    #: Used when no source is given: ``$POLYKV_LONGBENCH`` or the hub id.
    default_source = "hf:THUDM/LongBench"

    def __init__(self, dataset: str, source: str | Path | None = None, *, cache_dir: str | None = None):
        if dataset not in PROMPTS:
            raise ValueError(f"unknown LongBench dataset {dataset!r}; known: {', '.join(DATASETS)}")
        self.dataset = dataset
        self.source = source
        self.cache_dir = cache_dir
        self.name = f"longbench/{dataset}"  # type: ignore[misc]
        self.metric = LONGBENCH_METRICS[dataset].__name__  # type: ignore[misc]
        self.max_new_tokens = MAX_NEW_TOKENS[dataset]  # type: ignore[misc]
        self.description = f"LongBench {dataset} ({self.metric})"  # type: ignore[misc]

    def resolved_source(self) -> str:
        import os

        return str(self.source or os.environ.get("POLYKV_LONGBENCH") or self.default_source)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "source": self.resolved_source()}

    def generate(self, tokenizer, haystack_texts, n_samples, context_len, seed) -> list[Sample]:
        """``n_samples`` rows chosen by ``seed``; contexts cut in the middle to fit ``context_len``.

        ``haystack_texts`` is ignored (LongBench brings its own contexts).
        """
        check_request(n_samples, context_len)
        rows = load_longbench(self.resolved_source(), self.dataset, cache_dir=self.cache_dir)
        order = list(range(len(rows)))
        sample_rng(seed, self.name, 0).shuffle(order)
        return [self._sample(tokenizer, rows[i], i, context_len) for i in order[:n_samples]]

    def _sample(self, tokenizer, row: dict, row_index: int, context_len: int) -> Sample:
        classes = row.get("all_classes") or []
        ident = str(row.get("_id") or f"row{row_index}")

        def make(context_text: str, truncated: bool) -> Sample:
            context, question = split_prompt(self.dataset, context_text, row["input"] or "")
            return Sample(
                id=f"{self.name}:{ident}",
                task=self.name,
                context=context,
                question=question,
                answers=[str(a) for a in row["answers"]],
                chat=self.dataset not in NO_CHAT,
                max_new_tokens=self.max_new_tokens,
                meta={
                    "dataset": self.dataset,
                    "_id": ident,
                    "all_classes": list(classes),
                    "length": row.get("length"),
                    "truncated": truncated,
                },
            )

        measure = lambda s: prompt_length(tokenizer, s)  # noqa: E731
        full = make(row["context"], False)
        if measure(full) <= context_len:
            full.meta["prompt_tokens"] = measure(full)
            return full
        ids = tokenizer(row["context"], add_special_tokens=False)["input_ids"]

        def middle_cut(k: int) -> Sample:  # keep k tokens: first ceil(k/2), last floor(k/2)
            head = tokenizer.decode(ids[: k - k // 2], skip_special_tokens=True)
            tail = tokenizer.decode(ids[len(ids) - k // 2 :], skip_special_tokens=True) if k // 2 else ""
            return make(head + tail, True)

        try:
            sample, _ = fit_to_length(middle_cut, measure, context_len, 0, len(ids))
        except ValueError:
            raise ValueError(
                f"context length {context_len} cannot hold the {self.dataset} prompt without its context"
            ) from None
        sample.meta["prompt_tokens"] = measure(sample)
        return sample

    def check(self, sample: Sample) -> None:
        if not sample.answers:
            raise SampleCheckError(f"{sample.id}: no reference answers")

    def score(self, predictions: Sequence[str], samples: Sequence[Sample]) -> float:
        return longbench_score(
            self.dataset,
            list(predictions),
            [s.answers for s in samples],
            [s.meta.get("all_classes") or [] for s in samples],
        )
