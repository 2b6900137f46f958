"""`score`'s checks of its arguments that need no model: the fan-out, the run's length against the model's
positions and this machine's memory, and the strategies' declared context length against ``--context-len``."""

from __future__ import annotations

import argparse
from pathlib import Path

from polykv_search.cli.arg_types import at_most
from polykv_search.cli.common import CLIError
from polykv_search.cli.limits import check_backend, check_fan_out_flags

#: The most ``--samples`` per task: they are generated (each fitted to ``--context-len`` by tokenizing) and held
#: before the first is scored; RULER and LongBench have at most 500 per task.
MAX_SAMPLES = 10_000


#: ``--samples`` (``quickstart --eval-samples``): a positive integer of at most :data:`MAX_SAMPLES`.
sample_count = at_most(MAX_SAMPLES, "samples per task")


def check_longbench_sources(tasks: list) -> None:
    """Read a local LongBench source of each longbench task (a missing file or dataset is one line before any
    model or tokenizer loads); a hub source (``hf:``) is read where the samples are made."""
    from polykv_search.evaluation.longbench import load_longbench

    for task in tasks:
        source = task.resolved_source() if task.suite == "longbench" else "hf:"
        if not source.startswith("hf:"):
            load_longbench(source, task.dataset)


def check_fan_out(args: argparse.Namespace) -> None:
    check_fan_out_flags(args)
    check_backend(args.backend, args.address)


#: What :func:`tokens_after` counts, as the length check names it.
AFTER = "tokens decoded or teacher-forced after it"


def tokens_after(tasks: list, max_new_tokens: int | None = None) -> int:
    """The most tokens any of ``tasks`` runs after its prompt: its answer (``max_new_tokens`` overriding the
    tasks'), a teacher-forced continuation, and the decode suite's trajectory."""
    return max(
        (getattr(t, "generate_len", 0) if t.suite == "decode" else 0)
        + (t.max_new_tokens if max_new_tokens is None else max_new_tokens)
        + (getattr(t, "continuation_len", 0) if t.kind == "teacher_forced" else 0)
        for t in tasks
    )


def check_limits(
    args: argparse.Namespace, tasks: list, config: dict | None = None, context_flag: str = "--context-len {}"
) -> None:
    """Refuse ``--generate-len`` without the decode suite, and a run longer than the model's positions or
    this machine's memory (:mod:`polykv_search.cli.limits`; ``config``: the loaded model's, else read from disk;
    ``context_flag``: the flag the context length came from, as :func:`~polykv_search.cli.limits.check_lengths`)."""
    from polykv_search.cli.limits import ModelShape, check_lengths, model_shape

    decode = [t for t in tasks if t.suite == "decode"]
    if args.generate_len is not None and not decode:
        raise CLIError(
            "--generate-len sets the decode suite's trajectory length; add decode to --suite, or leave it out"
        )
    if not tasks:  # lm-eval tasks alone (--suite none): --context-len builds no prompt; lm-eval sizes its own
        return
    after = tokens_after(tasks, args.max_new_tokens)
    shape = model_shape(args.model) if config is None else ModelShape.from_config(args.model, config)
    local = args.backend in (None, "loky") or not args.address
    check_lengths(
        shape,
        context_len=args.context_len,
        after=after,
        after_flag="tokens decoded after it (--generate-len, answers)" if decode else AFTER,
        dtype=args.dtype,
        attn=args.attn,
        device=args.device,
        workers=args.jobs if local else 1,
        context_flag=context_flag,
    )


def check_held_budgets(strategies: list, context_len: int) -> None:
    """Refuse a strategy that would hold more tokens at ``--context-len`` than the budget it states: a ``full``
    layer or head group keeps the whole context whatever its budget, and a head-level strategy counts its groups
    at most at the context length it was built for (``context_len``), so scored at a longer one its keep-all
    heads (and groups above that length) hold more than its B says. ``strategies``: ``(path, Strategy)``."""
    from strategies import PHASES
    from strategies.head_groups import held_tokens

    for path, s in strategies:
        if s.global_budget is None:
            continue
        for phase in PHASES:
            for layer, choice in enumerate(s.phase(phase)):
                held = held_tokens(choice, context_len, s.num_kv_heads)
                if choice.budget is None or held <= choice.budget + 1e-9:
                    continue
                built = f" (built for {s.context_len}-token contexts)" if s.context_len else ""
                raise CLIError(
                    f"{path}{built}: layers[{layer}].{phase} holds {held:g} tokens per KV head at --context-len "
                    f"{context_len} but counts {choice.budget:g} in its B = {s.global_budget:g}; score it at the "
                    "context length it was solved for, or solve it again for this one (--target-context-len)"
                )


def check_entries(args: argparse.Namespace, strategies: list) -> None:
    """Refuse, before the model loads, entries that would share a name (a strategy file's stem, a baseline's
    name: ``full.json`` beside ``--baseline full``, ``a/s.json`` beside ``b/s.json``) and strategies whose layer
    (and, with head groups, KV head) count is not the model's, when its ``config.json`` is at hand."""
    from polykv_search.cli.baselines import baseline
    from polykv_search.cli.limits import check_fits_model

    names = [Path(path).stem for path, _ in strategies] + [
        baseline(spec, 1, args.budget).name for spec in args.baseline
    ]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CLIError(f"duplicate entry names: {twice} (an entry is named by its file's stem; rename one)")
    check_fits_model(strategies, args.model)
