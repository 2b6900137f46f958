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

Aggregation over samples: cosine is the mean of the per-sample mean cosines; PPL is ``exp`` of the
mean per-sample mean NLL (samples have equal lengths, so this is the pooled token PPL) and
``ΔPPL = PPL(cell) − PPL(FullKV)``; entropy and variance are per-sample means.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from signals.journal import Journal, JournalError, journal_path
from signals.table import PHASES, SignalTable

DEFAULT_PATTERNS: tuple[str, ...] = ("snapkv", "tova", "h2o", "streaming_llm", "knorm", "random")
DEFAULT_BUDGETS: tuple[int, ...] = (32, 64, 128, 256)
#: joblib backends for ``jobs > 1`` ("sequential": the task path in-process, for tests).
BACKENDS = ("loky", "dask", "ray", "sequential")

#: Bumped whenever what a cell's numbers mean changes; part of the journal key.
DEFINITIONS_VERSION = 1
DEFINITIONS = {
    "cosine": "mean over continuation positions of cos(layer-l output with the cell, with FullKV); mean over samples",
    "dppl": "exp(mean NLL of the m continuation tokens with the cell) - exp(same under FullKV); NLL pooled over samples",
    "entropy": "FullKV attention entropy / log(#visible keys), mean over heads and the phase's queries "
    "(prefill: prompt queries; decoding: continuation queries, teacher-forced)",
    "variance": "sum over keys of the variance over queries of FullKV attention, mean over heads "
    "(prefill: last 32 prompt queries; decoding: continuation queries)",
    "cells": "only layer l evicts; prefill: prompt cache compressed to b after the prompt's attention, continuation "
    "teacher-forced in one call; decoding: FullKV prompt, capacity b kept while the continuation is teacher-forced "
    "one token per step",
}


class CollectError(ValueError):
    """Bad collection input, or a journal that cannot be continued (one line)."""


@dataclass(frozen=True)
class CollectSettings:
    """The grid and method (picklable: sent to workers)."""

    patterns: tuple[str, ...]
    budgets: tuple[int, ...]
    phases: tuple[str, ...]
    layers: tuple[int, ...]
    naive: bool = False
    batch_tokens: int = 8192

    @property
    def cells_per_unit(self) -> int:
        return len(self.patterns) * len(self.budgets)


@dataclass(frozen=True)
class Unit:
    sample: int
    layer: int
    phase: str


@dataclass(frozen=True)
class ModelLoader:
    """A picklable recipe that loads the model in a worker process (``load_model`` arguments)."""

    name: str
    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"

    def __call__(self):
        from polykv_search.models import load_model

        return load_model(self.name, device=self.device, dtype=self.dtype, attn_implementation=self.attn_implementation)[0]


@dataclass(frozen=True)
class _GivenModel:
    """Ships an in-memory model to workers (fine for small models; use :class:`ModelLoader` otherwise)."""

    model: Any

    def __call__(self):
        return self.model


# ----------------------------------------------------------------------------- per sample
def sample_records(model, context_ids, continuation_ids, index: int, units: Sequence[Unit], settings: CollectSettings, *, need_full: bool) -> Iterator[dict]:
    """Records of one sample: its FullKV record (if ``need_full``), then one per unit, as each finishes."""
    from polykv_search.patterns import make_pattern
    from polykv_search.runtime import apply_strategy, model_spec
    from signals.fullkv import full_kv_pass
    from signals.replay import replay_unit
    from strategies import Strategy

    num_layers = model_spec(model).num_layers
    t0 = time.perf_counter()
    with torch.no_grad(), apply_strategy(model, Strategy.full(num_layers)) as rt:
        record = full_kv_pass(model, rt, context_ids, continuation_ids, phases=settings.phases)
        full = {
            "kind": "full",
            "sample": index,
            "nll": record.mean_nll,
            "entropy": record.entropy,
            "variance": record.variance,
        }
        if not settings.naive:
            full["seconds"] = time.perf_counter() - t0
            if need_full:
                yield full
            patterns = [make_pattern(p) for p in settings.patterns]
            for unit in units:
                t1 = time.perf_counter()
                cos, nll = replay_unit(
                    model, rt, record, unit.layer, unit.phase, patterns, settings.budgets, batch_tokens=settings.batch_tokens
                )
                yield _unit_record(unit, cos, nll, time.perf_counter() - t1)
            return
    del record
    yield from _naive_records(model, context_ids, continuation_ids, units, settings, full, t0, need_full)


def _naive_records(model, context_ids, continuation_ids, units, settings, full, t0, need_full):
    from signals.naive import NaiveReference, naive_cell

    reference = NaiveReference(model, context_ids, continuation_ids)
    full["nll"] = float(reference.nll.mean())
    full["seconds"] = time.perf_counter() - t0
    if need_full:
        yield full
    for unit in units:
        t1 = time.perf_counter()
        cos, nll = [], []
        for pattern in settings.patterns:
            for budget in settings.budgets:
                c, l = naive_cell(model, reference, context_ids, continuation_ids, unit.layer, unit.phase, pattern, budget)
                cos.append(c)
                nll.append(l)
        yield _unit_record(unit, cos, nll, time.perf_counter() - t1)


def _unit_record(unit: Unit, cos, nll, seconds: float) -> dict:
    return {
        "kind": "unit",
        "sample": unit.sample,
        "layer": unit.layer,
        "phase": unit.phase,
        "cosine": [float(x) for x in cos],
        "nll": [float(x) for x in nll],
        "seconds": seconds,
    }


# ----------------------------------------------------------------------------- workers
_WORKER_MODEL: dict[str, Any] = {}


def _worker_model(loader):
    key = repr(loader) if not isinstance(loader, _GivenModel) else f"given-{id(loader.model)}"
    if _WORKER_MODEL.get("key") != key:
        _WORKER_MODEL.clear()
        _WORKER_MODEL.update(key=key, model=loader())
    return _WORKER_MODEL["model"]


def _run_task(loader, context_ids, continuation_ids, index, units, settings, need_full, threads) -> list[dict]:
    if threads:
        torch.set_num_threads(threads)
    model = _worker_model(loader)
    return list(sample_records(model, context_ids, continuation_ids, index, units, settings, need_full=need_full))


@contextlib.contextmanager
def _backend(backend: str | None, address: str | None, jobs: int = 1):
    import joblib

    if backend in (None, "loky", "sequential"):
        with joblib.parallel_config(backend=backend or "loky"):
            yield
        return
    if backend == "dask":
        try:
            from dask.distributed import Client
        except ImportError:
            raise CollectError("--backend dask needs dask.distributed (pip install 'dask[distributed]')") from None
        # no address: a local cluster of ``jobs`` single-threaded worker processes
        client = Client(address) if address else Client(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None)
        with client:
            with joblib.parallel_config(backend="dask"):
                yield
        return
    if backend == "ray":
        try:
            import ray
            from ray.util.joblib import register_ray
        except ImportError:
            raise CollectError("--backend ray needs ray (pip install 'ray[default]')") from None
        started = not ray.is_initialized()
        if started:
            ray.init(address=address, num_cpus=None if address else jobs, ignore_reinit_error=True)
        register_ray()
        try:
            with joblib.parallel_config(backend="ray"):
                yield
        finally:
            if started:
                ray.shutdown()
        return
    raise CollectError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")


def _split(units: list[Unit], parts: int, num_layers: int) -> list[list[Unit]]:
    """Greedy split into ``parts`` groups of similar cost (a unit's cost ~ layers above it)."""
    parts = max(1, min(parts, len(units)))
    groups: list[list[Unit]] = [[] for _ in range(parts)]
    loads = [0.0] * parts
    for unit in sorted(units, key=lambda u: -(num_layers - u.layer)):
        i = loads.index(min(loads))
        groups[i].append(unit)
        loads[i] += num_layers - unit.layer + 2
    return [sorted(g, key=lambda u: (u.layer, PHASES.index(u.phase))) for g in groups if g]


# ----------------------------------------------------------------------------- progress
class _Progress:
    def __init__(self, enabled: bool, total: int, done: int, description: str):
        self._bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("cells×samples"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._bar.add_task(description, total=total, completed=done)

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


# ----------------------------------------------------------------------------- driver
def parse_layers(text: str | None, num_layers: int) -> tuple[int, ...]:
    """``None``/``"all"`` → every layer; else ``"0,5,10-12"`` (ranges inclusive)."""
    if text is None or str(text).strip() in ("", "all"):
        return tuple(range(num_layers))
    layers: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                layers.update(range(lo, hi + 1))
            else:
                layers.add(int(part))
        except ValueError:
            raise CollectError(f"layers: cannot read {part!r} (expected e.g. 0,5,10-12)") from None
    bad = sorted(x for x in layers if not 0 <= x < num_layers)
    if bad or not layers:
        raise CollectError(f"layers: {bad or text!r} out of range [0, {num_layers})")
    return tuple(sorted(layers))


def make_settings(num_layers: int, *, patterns, budgets, phases, layers, naive: bool, batch_tokens: int) -> CollectSettings:
    from polykv_search.patterns import PATTERNS

    patterns = tuple(patterns)
    if not patterns:
        raise CollectError("patterns: give at least one")
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        raise CollectError(f"patterns: unknown {', '.join(map(repr, unknown))} (known: {', '.join(PATTERNS)})")
    if len(set(patterns)) != len(patterns):
        raise CollectError(f"patterns: duplicates in {list(patterns)}")
    try:
        budgets = tuple(sorted(int(b) for b in budgets))
    except (TypeError, ValueError):
        raise CollectError(f"budgets: not integers: {budgets!r}") from None
    if not budgets or budgets[0] < 1 or len(set(budgets)) != len(budgets):
        raise CollectError(f"budgets: need distinct positive integers, got {list(budgets)}")
    phases = tuple(phases)
    bad = [p for p in phases if p not in PHASES]
    if not phases or bad or len(set(phases)) != len(phases):
        raise CollectError(f"phases: choose distinct values from {', '.join(PHASES)}, got {list(phases)}")
    phases = tuple(p for p in PHASES if p in phases)
    if isinstance(layers, str) or layers is None:
        layers = parse_layers(layers, num_layers)
    else:
        layers = parse_layers(",".join(str(int(x)) for x in layers), num_layers)
    if batch_tokens < 1:
        raise CollectError("batch_tokens must be positive")
    return CollectSettings(patterns, budgets, phases, layers, bool(naive), int(batch_tokens))


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
    progress
        Show a rich progress bar (cells × samples done / total, ETA) on stderr.
    provenance
        Extra provenance (e.g. the calibration description from ``describe_samples``).
    on_record
        Called with every record after it is persisted (tests inject interruptions here).
    """
    from polykv_search import __version__
    from polykv_search.data import samples_fingerprint
    from polykv_search.models import model_fingerprint
    from polykv_search.runtime import model_spec

    started = time.perf_counter()
    spec = model_spec(model)
    num_layers = spec.num_layers
    settings = make_settings(
        num_layers, patterns=patterns, budgets=budgets, phases=phases, layers=layers, naive=naive, batch_tokens=batch_tokens
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
    max_pos = getattr(spec.config, "max_position_embeddings", None)
    if max_pos and n + m > max_pos:
        raise CollectError(f"context + continuation = {n + m} tokens exceeds the model's {max_pos} positions")
    if not isinstance(jobs, int) or jobs < 1:
        raise CollectError(f"jobs must be a positive integer, got {jobs!r}")
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    device = str(next(model.parameters()).device)

    key = {
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
    }
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
        raise CollectError(f"nothing to resume: no journal at {jpath}" if jpath else "nothing to resume without a journal")
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
        with _Progress(progress, total, done, description) as bar:
            if jobs == 1 and backend in (None, "loky"):
                for s in sorted(per_sample):
                    sample = samples[s]
                    for rec in sample_records(
                        model, sample.context_ids, sample.continuation_ids, s, per_sample[s], settings, need_full=s in need_full
                    ):
                        bar.advance(persist(rec))
            elif per_sample:
                _run_parallel(samples, per_sample, need_full, settings, jobs, backend, address, model_loader or _GivenModel(model), num_layers, persist, bar)
    finally:
        jr.close()

    table = _assemble(jr, samples, settings, num_layers)
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
        "dtype": dtype,
        "device": device,
        "code_version": __version__,
        "torch": torch.__version__,
        "transformers": _transformers_version(),
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
    from signals.table import SignalTableError

    if not Path(out).is_file():
        return None
    try:
        table = SignalTable.load(out)
    except SignalTableError:
        return None
    return table if table.provenance.get("collect_key") == key else None


def _run_parallel(samples, per_sample, need_full, settings, jobs, backend, address, loader, num_layers, persist, bar) -> None:
    from joblib import Parallel, delayed

    local = backend in (None, "loky", "sequential")
    threads = max(1, (os.cpu_count() or 1) // jobs) if backend in (None, "loky") else None
    tasks = []
    for s in sorted(per_sample):
        groups = _split(per_sample[s], jobs, num_layers) or [[]]
        for i, group in enumerate(groups):
            tasks.append((s, group, s in need_full and i == 0))
    sample_ids = {s: (list(samples[s].context_ids), list(samples[s].continuation_ids)) for s in per_sample}
    with _backend(backend, address, jobs):
        n_jobs = 1 if backend == "sequential" else (jobs if local else -1)
        results = Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
            delayed(_run_task)(loader, *sample_ids[s], s, group, settings, full, threads) for s, group, full in tasks
        )
        for records in results:
            for rec in records:
                bar.advance(persist(rec))


def _assemble(jr: Journal, samples, settings: CollectSettings, num_layers: int) -> SignalTable:
    import numpy as np

    table = SignalTable.empty(num_layers, settings.phases, settings.patterns, settings.budgets)
    S = len(samples)
    if len(jr.full) == S:
        full_nll = float(np.mean([jr.full[s]["nll"] for s in range(S)]))
        full_ppl = math.exp(full_nll)
        table.set_full_ppl(full_ppl)
        for phase in settings.phases:
            for layer in range(num_layers):
                ent = [jr.full[s]["entropy"][phase][layer] for s in range(S)]
                var = [jr.full[s]["variance"][phase][layer] for s in range(S)]
                table.set_layer(layer, phase, entropy=float(np.mean(ent)), variance=float(np.mean(var)))
    else:
        full_ppl = None
    B = len(settings.budgets)
    for layer in settings.layers:
        for phase in settings.phases:
            recs = [jr.units.get((s, layer, phase)) for s in range(S)]
            if any(r is None for r in recs) or full_ppl is None:
                continue
            cos = np.mean([r["cosine"] for r in recs], axis=0)
            nll = np.mean([r["nll"] for r in recs], axis=0)
            for p, pattern in enumerate(settings.patterns):
                for b, budget in enumerate(settings.budgets):
                    i = p * B + b
                    try:
                        dppl = math.exp(float(nll[i])) - full_ppl
                    except OverflowError:
                        dppl = math.inf
                    table.set_cell(layer, phase, pattern, budget, cosine=float(cos[i]), dppl=dppl)
    return table


def _pattern_params(name: str) -> dict:
    from polykv_search.patterns import make_pattern

    return make_pattern(name).params()


def _transformers_version() -> str:
    import transformers

    return transformers.__version__
