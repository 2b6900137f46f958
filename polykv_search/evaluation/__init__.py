"""The task suite: RULER-style retrieval, broad context understanding, LongBench, decode (long generation).

Build a task from the registry, generate samples with a tokenizer and haystack text, run them with
plain HF calls (optionally inside the eviction runtime) and score them 0-100::

    task = get_task("ruler/niah_single")
    samples = task.generate(tokenizer, texts, n_samples=10, context_len=1024, seed=0)
    result = run_task(model, tokenizer, task, samples,
                      runner=lambda: apply_strategy(model, strategy))
    result.score
"""

from polykv_search.evaluation.base import SUITES, SampleCheckError, Task
from polykv_search.evaluation.longbench import LongBenchDataError, LongBenchTask, load_longbench
from polykv_search.evaluation.runner import TaskResult, greedy_generate, run_task, suite_scores, teacher_forced
from polykv_search.evaluation.samples import Sample, encode_prompt, prompt_length, samples_fingerprint
from polykv_search.evaluation.tasks import get_task, list_tasks, register, task_names, tasks_for

__all__ = [
    "SUITES",
    "LongBenchDataError",
    "LongBenchTask",
    "Sample",
    "SampleCheckError",
    "Task",
    "TaskResult",
    "encode_prompt",
    "get_task",
    "greedy_generate",
    "list_tasks",
    "load_longbench",
    "prompt_length",
    "register",
    "run_task",
    "samples_fingerprint",
    "suite_scores",
    "task_names",
    "tasks_for",
    "teacher_forced",
]
