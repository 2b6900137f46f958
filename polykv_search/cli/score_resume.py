"""`score`'s checkpoint: a stopped run of the same command resumes from ``<out>.partial``."""

from __future__ import annotations

from polykv_search.cli.common import console

#: ``--decode-batch``'s default; a run at it keeps the checkpoint key it had before the setting was recorded
DECODE_BATCH = 8


def open_checkpoint(out: str, settings: dict, engine: str, model_fp, entries, task_samples, shape: dict, protocol: str):
    """The run's checkpoint ``<out>.partial`` (:mod:`~polykv_search.scoring.checkpoint`): a stopped
    run of the same command resumes from it; one of another run (or protocol) is a one-line error."""
    from polykv_search.evaluation.samples import samples_fingerprint
    from polykv_search.protocol import AWARE
    from polykv_search.scoring import ScoreError
    from polykv_search.scoring.checkpoint import Checkpoint, run_key

    if settings.get("decode_batch") == DECODE_BATCH:  # a checkpoint of an earlier release still resumes
        settings = {k: v for k, v in settings.items() if k != "decode_batch"}
    key = run_key(
        versions=code_versions(),
        settings=settings,
        engine=engine,
        model=model_fp,
        entries=[[e.name, e.kind, e.strategy.to_json()] for e in entries],
        samples={name: samples_fingerprint(samples) for name, (_, samples) in task_samples.items()},
        **({"protocol": protocol} if protocol == AWARE else {}),  # question-agnostic runs keep their old keys
    )
    checkpoint = Checkpoint.open(f"{out}.partial", key, **shape, protocol=protocol)
    for (task, index), row in checkpoint.done.items():  # every finished sample is one of this run's
        samples = task_samples[task][1] if task in task_samples else []
        if index >= len(samples) or row["sample"] != samples[index].id:
            raise ScoreError(f"{checkpoint.path}: sample {index} of {task} is not one of this run's; delete it")
    if checkpoint.done:
        console.print(f"resuming: {len(checkpoint.done)} finished samples from {checkpoint.path}", soft_wrap=True)
    return checkpoint


def code_versions() -> dict[str, str]:
    """The code a run's numbers come from: a stopped run is not resumed by another release."""
    import torch
    import transformers

    import polykv_search

    return {
        "polykv_search": polykv_search.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
