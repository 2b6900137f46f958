"""The collection driver: every (layer, phase, pattern, budget) cell of a grid, over calibration samples.

>>> from signals import collect_signals                                  # doctest: +SKIP
>>> table = collect_signals(model, samples, budgets=[32, 64], out="signals.json")

Work is cut into *units* — one (sample, layer, phase) with all its (pattern, budget) cells — run
sample by sample: one FullKV pass per sample (:mod:`signals.fullkv`), then each unit by replay
(:mod:`signals.replay`; or, with ``naive=True``, one full forward per cell, :mod:`signals.naive`).
Every finished unit is appended to a journal next to the output (:mod:`signals.journal`); rerunning
the same collection continues from it and ends with the same table as an uninterrupted run, and a
journal from a different model, grid or calibration set is refused. ``jobs > 1`` fans the units out
through joblib (local processes by default; ``backend="dask"`` or ``"ray"`` for a cluster, whose
workers must be able to load the model by name).

Aggregation over samples (:mod:`signals.collect_assemble`): cosine and KL are means of the
per-sample means; PPL is ``exp`` of the mean per-sample mean NLL (samples have equal lengths, so this
is the pooled token PPL) and ``ΔPPL = PPL(cell) − PPL(FullKV)``; every cell also keeps its
per-sample values and standard errors over (sample, token block) units; entropy and variance are
per-sample means.

Modules: :mod:`signals.collect_settings` (grid, definitions), :mod:`signals.collect_sample` (one
sample's records: FullKV pass, replay or naive cells), :mod:`signals.collect_parallel` (workers,
backends, progress), :mod:`signals.collect_assemble` (records → table).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from polykv_search import __version__
from polykv_search.data import samples_fingerprint
from polykv_search.data.evidence import describe_evidence
from polykv_search.models import model_fingerprint
from polykv_search.patterns import make_spec
from polykv_search.runtime import model_spec
from signals.collect_assemble import assemble
from signals.collect_parallel import BACKENDS, ModelLoader, Progress, _GivenModel, run_parallel
from signals.collect_sample import sample_records
from signals.collect_settings import (
    DEFAULT_BUDGETS,
    DEFAULT_PATTERNS,
    DEFINITIONS,
    DEFINITIONS_VERSION,
    CollectError,
    CollectSettings,
    Unit,
    make_settings,
    parse_layers,
    scored_key,
    scored_spans,
)
from signals.journal import Journal, JournalError, journal_path
from signals.table import SignalTable, SignalTableError
from signals.uncertainty import DEFAULT_BLOCKS, block_sizes
from strategies import PHASES


# ----------------------------------------------------------------------------- driver
def model_name(model) -> str:
    source = getattr(model, "polykv_source", None)
    if source is not None:
        return source.name
    return str(getattr(model.config, "name_or_path", "") or getattr(model.config, "model_type", "?"))


def collect_signals(
    model,
    samples: Sequence,
    *,
    patterns: Sequence[str] = DEFAULT_PATTERNS,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    phases: Sequence[str] = PHASES,
    layers: Sequence[int] | str | None = None,
    naive: bool = False,
    out: str | Path | None = None,
    journal: str | Path | None | bool = True,
    fresh: bool = False,
    require_resume: bool = False,
    jobs: int = 1,
    backend: str | None = None,
    address: str | None = None,
    model_loader: Callable[[], Any] | None = None,
    progress: bool = False,
    provenance: Mapping[str, Any] | None = None,
    batch_tokens: int = 8192,
    blocks: int = DEFAULT_BLOCKS,
    on_record: Callable[[dict], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> SignalTable:
    """Collect the signal table of ``model`` on calibration ``samples``.

    Parameters
    ----------
    model
        A loaded causal LM of a supported architecture (eval mode).
    samples
        :class:`polykv_search.data.Sample` objects (or anything with ``context_ids`` and
        ``continuation_ids``), all of the same lengths; the continuation needs ≥ 2 tokens.
    patterns, budgets, phases, layers
        The grid (``layers``: indices, ``"0-3,8"`` or ``None`` for all; the table always has every
        layer, uncollected cells stay missing). Entropy/variance are collected for every layer.
    naive
        One full forward per cell instead of the replay (the reference; slow).
    out
        Where to write the table (atomically) when done; its journal lives at ``<out>.journal``.
    journal
        ``True``: next to ``out`` (in memory when ``out`` is None); a path; or ``False``/None (none).
    fresh
        Discard an existing journal instead of continuing it.
    require_resume
        Raise :class:`CollectError` when there is no journal to continue.
    jobs, backend, address
        ``jobs > 1`` runs units in parallel through joblib (``backend``: loky (default), dask, ray;
        ``address``: the cluster's scheduler). Workers load the model with ``model_loader`` (e.g.
        :class:`ModelLoader`); without one the model object itself is shipped.
    blocks
        Token blocks per continuation for the standard errors (:mod:`signals.uncertainty`).
    progress
        Show a rich progress bar (cells × samples done / total, ETA) on stderr.
    provenance
        Extra provenance (e.g. the calibration description from ``describe_samples``).
    on_record
        Called with every record after it is persisted (tests inject interruptions here).
    """
    started = time.perf_counter()
    spec = model_spec(model)
    num_layers = spec.num_layers
    settings = make_settings(
        num_layers,
        patterns=patterns,
        budgets=budgets,
        phases=phases,
        layers=layers,
        naive=naive,
        batch_tokens=batch_tokens,
        blocks=blocks,
    )
    samples = list(samples)
    if not samples:
        raise CollectError("samples: need at least one calibration sample")
    n = len(samples[0].context_ids)
    m = len(samples[0].continuation_ids)
    if any(len(s.context_ids) != n or len(s.continuation_ids) != m for s in samples):
        raise CollectError("samples: every sample needs the same context and continuation lengths")
    if n < 1 or m < 2:
        raise CollectError(f"samples: need a context of >= 1 token and a continuation of >= 2 tokens, got {n}+{m}")
    spans = scored_spans(samples, m)
    max_pos = getattr(spec.config, "max_position_embeddings", None)
    if max_pos and n + m > max_pos:
        raise CollectError(f"context + continuation = {n + m} tokens exceeds the model's {max_pos} positions")
    if not isinstance(jobs, int) or jobs < 1:
        raise CollectError(f"jobs must be a positive integer, got {jobs!r}")
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    device = str(next(model.parameters()).device)

    key: dict[str, Any] = {
        "model": model_name(model),
        "model_fingerprint": model_fingerprint(model),
        "calibration": samples_fingerprint(samples),
        "context_len": n,
        "continuation_len": m,
        "layers": list(settings.layers),
        "phases": list(settings.phases),
        "patterns": list(settings.patterns),
        "budgets": list(settings.budgets),
        "method": "naive" if settings.naive else "replay",
        "dtype": dtype,
        "definitions": DEFINITIONS_VERSION,
        "blocks": settings.blocks,
    }
    key.update(scored_key(key["calibration"], spans, m))
    if journal is True:
        jpath = journal_path(out) if out is not None else None
    elif journal:
        jpath = Path(journal)
    else:
        jpath = None
    existed = jpath is not None and jpath.exists()
    if out is not None and not existed and not fresh:
        finished = _finished_table(out, key)
        if finished is not None:
            if log:
                log(f"{out} already holds this collection (same model, grid and calibration set); nothing to do")
            return finished
    if require_resume and not existed and not fresh:
        raise CollectError(
            f"nothing to resume: no journal at {jpath}" if jpath else "nothing to resume without a journal"
        )
    try:
        jr = Journal.open(jpath, key, fresh=fresh)
    except JournalError as err:
        raise CollectError(str(err)) from None

    all_units = [Unit(s, l, f) for s in range(len(samples)) for l in settings.layers for f in settings.phases]
    pending = [u for u in all_units if (u.sample, u.layer, u.phase) not in jr.units]
    need_full = {s for s in range(len(samples)) if s not in jr.full}
    per_sample: dict[int, list[Unit]] = {}
    for u in pending:
        per_sample.setdefault(u.sample, []).append(u)
    for s in need_full:
        per_sample.setdefault(s, [])
    cells = settings.cells_per_unit
    total, done = len(all_units) * cells, (len(all_units) - len(pending)) * cells
    if log and jr.resumed:
        log(f"resuming from {jpath}: {done}/{total} cell evaluations already done")

    def persist(rec: dict) -> int:
        jr.add(rec)
        if on_record is not None:
            on_record(rec)
        return cells if rec["kind"] == "unit" else 0

    description = "collect (naive)" if settings.naive else "collect"
    try:
        with Progress(progress, total, done, description) as bar:
            if jobs == 1 and backend in (None, "loky"):
                for s in sorted(per_sample):
                    sample = samples[s]
                    for rec in sample_records(
                        model,
                        sample.context_ids,
                        sample.continuation_ids,
                        s,
                        per_sample[s],
                        settings,
                        need_full=s in need_full,
                        scored=spans[s],
                    ):
                        bar.advance(persist(rec))
            elif per_sample:
                loader = model_loader or _GivenModel(model)
                run_parallel(
                    samples,
                    per_sample,
                    need_full,
                    settings,
                    jobs,
                    backend,
                    address,
                    loader,
                    num_layers,
                    persist,
                    bar,
                    spans,
                )
    finally:
        jr.close()

    table, overflowed = assemble(jr, len(samples), m, settings, num_layers, [b - a for a, b in spans])
    blocks_per_sample: Any = [len(block_sizes(b - a, settings.blocks)) for a, b in spans]
    blocks_per_sample = blocks_per_sample[0] if len(set(blocks_per_sample)) == 1 else blocks_per_sample
    compute = sum(r.get("seconds", 0.0) for r in (*jr.full.values(), *jr.units.values()))
    table.provenance = {
        "model": key["model"],
        "config_hash": key["model_fingerprint"],
        "architecture": spec.model_type,
        "calibration": dict(provenance.get("calibration", {})) if provenance else {"fingerprint": key["calibration"]},
        "n_samples": len(samples),
        "context_len": n,
        "continuation_len": m,
        "patterns": {p: _pattern_params(p) for p in settings.patterns},
        "layers": "all" if len(settings.layers) == num_layers else list(settings.layers),
        "method": key["method"],
        "definitions_version": DEFINITIONS_VERSION,
        "collect_key": key,
        "definitions": DEFINITIONS,
        "uncertainty": {"blocks_per_sample": blocks_per_sample, "units": table.se_dof + 1 if table.se_dof else 1},
        "retrieval": describe_evidence(samples),
        "overflowed_cells": overflowed,
        "dtype": dtype,
        "device": device,
        "code_version": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "timings": {
            "wall_seconds_last_run": round(time.perf_counter() - started, 3),
            "compute_seconds": round(compute, 3),
            "full_pass_seconds": round(sum(r.get("seconds", 0.0) for r in jr.full.values()), 3),
            "resumed": bool(existed and not fresh),
            "jobs": jobs,
            "backend": backend or ("loky" if jobs > 1 else "in-process"),
        },
    }
    if provenance:
        for k, v in provenance.items():
            if k != "calibration":
                table.provenance[k] = v
        if "calibration" in provenance:
            table.provenance["calibration"].setdefault("fingerprint", key["calibration"])
    if out is not None:
        table.save(out)
        jr.remove()
    return table


def _finished_table(out, key) -> SignalTable | None:
    """The table at ``out`` if it is a finished collection with this very key."""
    if not Path(out).is_file():
        return None
    try:
        table = SignalTable.load(out)
    except SignalTableError:
        return None
    return table if table.provenance.get("collect_key") == key else None


def _pattern_params(spec: str) -> dict:
    return make_spec(spec).params()


__all__ = [
    "BACKENDS",
    "DEFAULT_BLOCKS",
    "DEFAULT_BUDGETS",
    "DEFAULT_PATTERNS",
    "DEFINITIONS",
    "DEFINITIONS_VERSION",
    "CollectError",
    "CollectSettings",
    "ModelLoader",
    "Unit",
    "collect_signals",
    "make_settings",
    "parse_layers",
    "sample_records",
]
