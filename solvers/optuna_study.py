"""The optuna study around the solver: storage, sampler, configuration check, progress, Pareto front."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import time
import warnings
from pathlib import Path
from typing import Any

from polykv_search.paths import cache_dir
from solvers.base import Problem, SolverError, SolveResult, jsonable
from solvers.optuna_settings import OptunaSettings
from solvers.problem import layer_choice
from strategies.strategy import Strategy

# optuna itself is imported inside the functions that use it (import_optuna turns its absence into a
# SolverError): listing or registering solvers loads this module without running a study.


def make_sampler(optuna, s: OptunaSettings) -> tuple[Any, dict[str, Any]]:
    """The explicit sampler of the study and its description for provenance."""
    from optuna.exceptions import ExperimentalWarning

    if s.two_objectives and s.mo_sampler == "nsga2":
        desc = {
            "class": "NSGAIISampler",
            "population_size": s.population,
            "seed": s.seed,
            "crossover_prob": 0.9,
            "swapping_prob": 0.5,
        }
        return optuna.samplers.NSGAIISampler(
            population_size=s.population, seed=s.seed, crossover_prob=0.9, swapping_prob=0.5
        ), desc
    desc = {
        "class": "TPESampler",
        "seed": s.seed,
        "n_startup_trials": s.startup_trials,
        "n_ei_candidates": 24,
        "multivariate": True,
        "group": True,
        "constant_liar": True,
        "optuna_version": optuna.__version__,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=s.seed,
            n_startup_trials=s.startup_trials,
            n_ei_candidates=24,
            multivariate=True,
            group=True,
            constant_liar=True,
        )
    return sampler, desc


def check_config(study, config: dict[str, Any], name: str, storage: str) -> None:
    stored = study.user_attrs.get("polykv_config")
    if stored is None:
        if study.trials:
            raise SolverError(f"study {name!r} in {storage} was not made by polykv-search; use another --study-name")
        study.set_user_attr("polykv_config", config)
        return
    if stored != config:
        keys = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
        raise SolverError(
            f"study {name!r} in {storage} was made for a different problem or settings ({', '.join(keys)} differ); "
            "use another --study-name or --storage"
        )


def front_strategies(result: SolveResult) -> list[tuple[str, Any]]:
    """One ``(suffix, Strategy)`` per Pareto front point of an ``objectives="quality,memory"``
    result, in increasing memory (``"-pareto00"``, ``"-pareto01"``, ...); ``[("", strategy)]`` for a
    single-objective result. Each strategy's ``global_budget`` is the point's budget (≤ B) and its
    provenance records the point (trial, quality, memory) and ``budget_cap`` = B."""
    front = (result.info or {}).get("front") or []
    if not front:
        return [("", result.strategy)]
    cap = result.strategy.provenance.get("budget_cap", result.strategy.provenance.get("global_budget"))
    if cap is None:
        cap = max(p["budget"] for p in front)
    width = max(2, len(str(len(front) - 1)))
    return [
        (f"-pareto{i:0{width}d}", point_strategy(result.strategy, point, cap, index=i)) for i, point in enumerate(front)
    ]


def point_strategy(template, point: dict[str, Any], cap: float, index: int | None = None):
    provenance = copy.deepcopy(template.provenance)
    provenance["global_budget"] = point["budget"]
    provenance["budget_cap"] = cap
    provenance["pareto_point"] = {k: v for k, v in point.items() if k != "choices"} | (
        {"index": index} if index is not None else {}
    )
    ch = point["choices"]
    return Strategy(
        [layer_choice(p, int(b)) for p, b in ch["prefill"]],
        [layer_choice(p, int(b)) for p, b in ch["decoding"]],
        float(point["budget"]),
        template.b_min,
        provenance,
    )


def pareto_front(trials: list) -> list:
    """Non-dominated trials (maximize values[0], minimize values[1]), one per distinct strategy,
    sorted by memory then quality."""
    pts = sorted(trials, key=lambda t: (t.values[1], -t.values[0], t.number))
    front, seen, best_q = [], set(), -math.inf
    for t in pts:
        q = t.values[0]
        if q > best_q:
            key = t.user_attrs.get("key")
            if key not in seen:
                front.append(t)
                seen.add(key)
            best_q = q
    return front


def trial_row(t, with_choices: bool = False) -> dict[str, Any]:
    row = {
        "trial": t.number,
        "values": list(t.values),
        "quality": t.values[0],
        "memory": t.values[1] if len(t.values) > 1 else None,
        "budget": t.user_attrs.get("budget"),
        "family": t.params.get("family"),
        "params": {k: v for k, v in t.params.items() if not re.fullmatch(r"(prefill|decoding)_pattern_\d+", k)},
        "anchor": t.user_attrs.get("anchor"),
    }
    if with_choices:
        row["choices"] = t.user_attrs.get("choices")
    return row


def progress(study) -> tuple[int, int]:
    """(strategies scored by the evaluator, trials finished) in the whole study."""
    from optuna.trial import TrialState

    scored = finished = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        finished += 1
        scored += t.state == TrialState.COMPLETE and not t.user_attrs.get("cached")
    return scored, finished


class StopWhenScored:
    """Stops every worker of the study once ``trials`` strategies are scored (or ``cap`` trials,
    repeats included, are finished)."""

    def __init__(self, trials: int, cap: int):
        self.trials, self.cap = trials, cap

    def __call__(self, study, trial) -> None:
        scored, finished = progress(study)
        if scored >= self.trials or finished >= self.cap:
            study.stop()


def stored_values(study, key: str):
    """Values of a finished trial of the same strategy (another worker's or an earlier run's)."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("key") == key:
            extra = {k: v for k, v in t.user_attrs.items() if k in ("scores", "kv_ratio", "seconds", "memory_unit")}
            return tuple(t.values), extra
    return None


# ============================================================================ helpers
def lowest_budget(problem: Problem, settings: OptunaSettings) -> float:
    """The smallest budget a quality,memory trial may choose."""
    return max(float(problem.b_min), settings.min_budget_share * problem.global_budget)


def import_optuna():
    try:
        import optuna
    except ModuleNotFoundError:  # pragma: no cover - optuna is a dependency
        raise SolverError("solver 'optuna' needs the optuna package (pip install optuna)") from None
    return optuna


def check_storage(spec: str | None) -> None:
    """Refuse a ``storage`` that cannot work, before the scoring model loads, creating nothing.

    ``memory`` and the default pass. An RDB URL must parse and name an installed dialect and driver
    (a sqlite file: in an existing folder, writable); a redis URL needs the redis package; a journal
    file path must not be a folder and must be writable where it would be created. Whether a
    database server answers is only known when the study opens it."""
    if spec is None or spec.strip().lower() in ("memory", ":memory:"):
        return
    if "://" not in spec:
        _check_storage_file(Path(spec).expanduser(), spec, make_folders=True)
        return
    desc = _hide_password(spec)
    if spec.startswith("redis"):
        try:
            import redis  # noqa: F401
        except ImportError as err:
            raise SolverError(f"storage {desc}: a redis storage needs the redis package ({err})") from None
        return
    try:
        from sqlalchemy.engine import make_url

        url = make_url(spec)
        dialect = url.get_dialect()
        # SQLAlchemy 2 imports the driver with import_dbapi(); 1.4 (optuna allows it) with the classmethod dbapi()
        dialect.import_dbapi() if hasattr(dialect, "import_dbapi") else dialect.dbapi()  # type: ignore[operator,misc]
    except Exception as err:  # noqa: BLE001 - sqlalchemy's URL, dialect and driver errors
        raise SolverError(f"storage {desc}: {first_line(err)}") from None
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        _check_storage_file(Path(url.database), desc, make_folders=False)


def _check_storage_file(path: Path, desc: str, *, make_folders: bool) -> None:
    import os
    import tempfile

    if path.is_dir():
        raise SolverError(f"storage {desc}: is a directory; give a file path")
    folder = path.absolute().parent
    if not make_folders and not folder.is_dir():
        raise SolverError(f"storage {desc}: folder {folder} does not exist")
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise SolverError(f"storage {desc}: {folder} is not a directory")
    try:
        if path.exists():
            with path.open("r+b"):
                pass
        else:
            fd, probe = tempfile.mkstemp(prefix=".polykv-probe.", suffix=".tmp", dir=folder)
            os.close(fd)
            os.unlink(probe)
    except OSError as err:
        raise SolverError(f"storage {desc}: cannot write in {folder} ({err.strerror or err})") from None


def _hide_password(spec: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", spec)


def make_storage(optuna, spec: str | None, study_name: str) -> tuple[Any, str]:
    """(storage object or URL, description for provenance with any password hidden)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if spec is not None and spec.strip().lower() in ("memory", ":memory:"):
        return optuna.storages.InMemoryStorage(), "memory"
    if spec is not None and "://" in spec:
        desc = _hide_password(spec)
        if spec.startswith("redis"):
            try:
                from optuna.storages.journal import JournalRedisBackend

                return JournalStorage(JournalRedisBackend(spec)), desc
            except Exception as err:  # noqa: BLE001
                raise SolverError(f"storage {desc}: {first_line(err)}") from None
        for attempt in range(4):  # workers starting together race to create the schema
            try:
                return optuna.storages.RDBStorage(spec), desc
            except Exception as err:  # noqa: BLE001 - sqlalchemy/driver errors
                if attempt == 3 or "IntegrityError" not in f"{type(err).__name__} {err}":
                    raise SolverError(f"storage {desc}: {first_line(err)}") from None
                time.sleep(0.5 * (attempt + 1))
    if spec is None:
        path = cache_dir("optuna") / f"{study_name}.journal"
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            raise SolverError(f"storage {spec}: is a directory; give a journal file path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SolverError(f"storage {spec}: cannot create {path.parent} ({err.strerror})") from None
    try:
        return JournalStorage(JournalFileBackend(str(path))), str(path)
    except Exception as err:  # noqa: BLE001
        raise SolverError(f"storage {path}: {first_line(err)}") from None


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(jsonable(obj), sort_keys=True).encode()).hexdigest()


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]


__all__ = [
    "StopWhenScored",
    "check_config",
    "check_storage",
    "front_strategies",
    "make_sampler",
    "make_storage",
    "pareto_front",
    "point_strategy",
]
