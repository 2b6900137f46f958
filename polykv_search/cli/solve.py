"""`polykv-search solve`: turn a signal table (or nothing, for baselines) into a strategy."""

from __future__ import annotations

import argparse
from pathlib import Path

from polykv_search.cli.arg_types import at_most, comma_list, pattern_specs, positive_float, positive_int
from polykv_search.cli.common import CLIError, Interrupted, check_output_path, console, out
from polykv_search.cli.outputs import check_not_an_input
from polykv_search.cli.solve_guard import GUARD_DESTS, add_guard_args, apply_guard, check_guard_args

#: The most layers ``--num-layers`` takes: the deepest transformer LMs have a few hundred; a strategy of 10,000
#: takes seconds to solve and write, one of 10**8 would run for hours and fill the memory.
MAX_LAYERS = 10_000

#: Flags that belong to the problem, not to a solver's settings.
_PROBLEM_DESTS = {
    "method",
    "signals",
    "budget",
    "b_min",
    "model",
    "num_layers",
    "phases",
    "grid",
    "out",
    "list_methods",
    "func",
    "command",
    "patterns",
    "max_budget",
    "uniform_budgets",
    "fixed_pattern",
    "default_pattern",
    *GUARD_DESTS,
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "solve",
        help="compute a strategy with a solver",
        description="Solve for a strategy: signal table + (B, b_min, phases, grid) -> strategy.json. "
        "Solver settings are flags too (see --list-methods).",
    )
    p.add_argument("--method", default="proportional", help="solver name (default proportional; see --list-methods)")
    p.add_argument("--list-methods", action="store_true", help="list the solvers and their settings, then exit")
    p.add_argument("--signals", help="signal table from `polykv-search collect` (needed by table-driven solvers)")
    p.add_argument("--budget", type=positive_float, help="global budget B: average tokens kept per layer")
    p.add_argument(
        "--b-min", type=positive_int, default=None, help="smallest budget of any layer (default: min(16, B))"
    )
    p.add_argument(
        "--model",
        default=None,
        help="model whose layer count to use when no signal table is given (default smollm2-135m)",
    )
    p.add_argument(
        "--num-layers",
        type=layer_count,
        help=f"layer count, instead of reading it from --model (at most {MAX_LAYERS:,})",
    )
    p.add_argument(
        "--phases",
        type=comma_list(str, "phase"),
        help="phases to optimize, comma separated (default: the table's, or both)",
    )
    p.add_argument(
        "--grid",
        type=comma_list(positive_int, "budget"),
        help="budget grid for ilp/dp, comma separated (default: the table's)",
    )
    p.add_argument(
        "--patterns",
        type=pattern_specs(),
        help="patterns the solver may choose, comma separated (default: the table's); a pattern with parameters "
        "is a column of the table such as kvzip[allocation=model]",
    )
    p.add_argument("--max-budget", type=positive_int, help="the most a layer can use (e.g. the context length)")
    p.add_argument(
        "--default-pattern",
        default="snapkv",
        metavar="P",
        help="pattern of the phases not optimized, at floor(B) in every layer (default snapkv)",
    )
    p.add_argument(
        "--uniform-budgets",
        action="store_true",
        help="ablation 'patterns only': every optimized layer gets floor(B); the solver chooses patterns",
    )
    p.add_argument(
        "--fixed-pattern",
        metavar="P",
        help="ablation 'budgets only': every optimized layer uses pattern P; the solver chooses budgets",
    )
    p.add_argument("--out", help="where to write the strategy JSON")
    add_guard_args(p)
    _add_solver_settings(p)
    p.set_defaults(func=run)


#: ``--num-layers``: a positive integer of at most :data:`MAX_LAYERS`.
layer_count = at_most(MAX_LAYERS, "layers")


def _add_solver_settings(p: argparse.ArgumentParser) -> None:
    """Every solver setting as a flag; only flags given on the command line reach the solver."""
    from solvers import get_solver_class, list_methods

    g = p.add_argument_group("solver settings (each applies to the solvers that have it)")
    seen: dict[str, list[str]] = {}
    infos = {}
    for m in list_methods():
        if not m.available:
            continue
        for info in get_solver_class(m.name).Settings.fields_info():
            seen.setdefault(info.flag, []).append(m.name)
            infos.setdefault(info.flag, info)
    for flag, info in infos.items():
        if flag.lstrip("-").replace("-", "_") in _PROBLEM_DESTS:
            continue
        g.add_argument(
            flag,
            default=argparse.SUPPRESS,
            metavar=info.type.split("|")[0].upper(),
            help=f"{info.help} [{', '.join(seen[flag])}]",
        )


def num_layers_of(model: str) -> int:
    from transformers import AutoConfig

    from polykv_search.models import model_path

    try:
        return int(AutoConfig.from_pretrained(model_path(model)).num_hidden_layers)
    except OSError as err:
        raise CLIError(f"cannot read the config of {model!r}: {str(err).splitlines()[0]}") from None


def run(args: argparse.Namespace) -> int:
    from solvers import Problem, get_solver_class, list_methods

    if args.list_methods:
        return _list_methods(list_methods, get_solver_class)
    cls = get_solver_class(args.method)  # an unknown method is named before a missing flag
    if args.budget is None:
        raise CLIError("--budget is required")
    if not args.out:
        raise CLIError("--out is required")
    check_output_path(args.out)  # before a table or (optuna) a model is loaded
    check_not_an_input(
        args.out,
        "--out",
        [("the --signals table", args.signals), ("the --start strategy", getattr(args, "start", None))],
    )
    check_guard_args(args)
    names = {i.name for i in cls.Settings.fields_info()}
    given = {k: v for k, v in vars(args).items() if k not in _PROBLEM_DESTS}
    unknown = sorted(k for k in given if k not in names)
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise CLIError(f"{flags} do not apply to the {args.method!r} solver")
    if args.model and "model" in names:  # solvers that run the model (optuna, search) take it as a setting
        given["model"] = args.model
    if "journal" in names:  # a resumable solver (search): OUT.journal unless told
        from signals.journal import journal_path

        if "journal" not in given:
            given["journal"] = str(check_output_path(journal_path(args.out), "--out"))
        elif str(given["journal"]).lower() != "none":
            check_output_path(given["journal"], "--journal")
    settings = cls.Settings.from_strings({k: str(v) for k, v in given.items()})
    _check_granularity(args, settings, given)
    table = None
    if args.signals:
        from signals import SignalTable

        table = SignalTable.load(args.signals)
    elif cls.needs_table:
        raise CLIError(f"the {args.method!r} solver needs --signals (run `polykv-search collect` first)")
    _check_window(settings, table)
    num_layers = args.num_layers
    if table is None and num_layers is None:
        from polykv_search.models import DEFAULT_MODEL

        num_layers = num_layers_of(args.model or DEFAULT_MODEL)
    b_min = args.b_min if args.b_min is not None else int(min(16, args.budget))
    problem = Problem(
        global_budget=args.budget,
        table=table,
        num_layers=num_layers,
        b_min=b_min,
        phases=args.phases,
        budgets=args.grid,
        patterns=args.patterns,
        max_budget=args.max_budget,
        uniform_budgets=args.uniform_budgets,
        fixed_pattern=args.fixed_pattern,
        default_pattern=args.default_pattern,
    )
    try:
        result = cls(settings).solve(problem)
    except KeyboardInterrupt:
        if str(given.get("journal", "none")).lower() == "none":
            raise
        raise Interrupted(
            f"measured strategies are kept in {given['journal']}; rerun the same command to continue"
        ) from None
    strategy = apply_guard(args, problem, result) if args.guard else result.strategy
    if "search" in strategy.provenance:
        from polykv_search.cli.solve_search import print_search

        print_search(strategy.provenance["search"])
    if "pool_prior" in strategy.provenance:
        from polykv_search.cli.solve_search import print_pool_prior

        print_pool_prior(strategy.provenance["pool_prior"])
    if args.model:
        strategy.provenance.setdefault("model", args.model)
    strategy.provenance.setdefault("predicted", dict(result.predicted))
    outputs = [("", strategy)]
    if args.method == "optuna":
        from solvers.optuna_search import front_strategies

        outputs = front_strategies(result)
    method = args.method
    if strategy.provenance.get("guard", {}).get("replaced"):
        method = f"{strategy.provenance['guard']['chosen']} (the guard's choice over {args.method})"
    for suffix, written in outputs:
        path = Path(args.out)
        path = path.with_name(path.stem + suffix + path.suffix)
        written.save(path)
        console.print(f"wrote {path}: {method}, B={written.global_budget:g}, b_min={b_min}", markup=False)
    predicted = strategy.provenance.get("predicted") or {}
    pred = ", ".join(f"{k} {v:.4g}" for k, v in predicted.items() if v is not None)
    if pred:
        console.print(f"predicted degradation (sum over optimized layers and phases): {pred}")
    unused = strategy.provenance.get("unused_budget", result.unused_budget)
    total = strategy.provenance.get("budget_total", problem.total)
    if unused:
        spare = ", ".join(f"{p} {n} ({n / total:.1%})" for p, n in unused.items()) if total else ""
        console.print(f"unused budget (of {total} tokens per phase): {spare}", highlight=False)
    if result.message and strategy is result.strategy:
        console.print(result.message, highlight=False, markup=False)  # may name kvzip[allocation=model]
    pool = _model_pool_note(strategy) if table is not None else None
    if pool:
        console.print(pool, highlight=False, markup=False)
    return 0


def _check_window(settings, table) -> None:
    """A solver that builds ``context_len``-token prompts of its tasks (optuna) is refused, before its model loads,
    when they pass the model's window or this machine's memory (:func:`~polykv_search.cli.limits.check_lengths`)."""
    if not hasattr(settings, "context_len"):
        return
    from polykv_search.cli.limits import check_lengths, model_shape
    from polykv_search.cli.score_checks import AFTER, tokens_after
    from polykv_search.models import DEFAULT_MODEL, ModelError
    from polykv_search.scoring import ScoreError, resolve_tasks

    model = settings.model or (table.provenance.get("model") if table is not None else None) or DEFAULT_MODEL
    try:
        shape, tasks = model_shape(model), resolve_tasks(settings.tasks)
    except (ModelError, ScoreError):
        return  # the solver's own one-line errors, where it reads them
    check_lengths(
        shape,
        context_len=settings.context_len,
        after=tokens_after(tasks),
        after_flag=AFTER,
        dtype=settings.dtype,
        device=settings.device,
        workers=settings.jobs,
    )


def _check_granularity(args: argparse.Namespace, settings, given: dict) -> None:
    """Refuse the pattern flag of the other granularity: ``--patterns`` names the layer-level table's columns,
    ``--head-patterns`` the per-KV-head cells; each is ignored at the other level, so it is refused."""
    head = getattr(settings, "granularity", "layer") == "head"
    if head and args.patterns:
        raise CLIError(
            "--patterns names the layer-level table's columns, which --granularity head does not read; "
            "choose the head cells' patterns with --head-patterns"
        )
    if "head_patterns" in given and not head:
        raise CLIError(
            "--head-patterns chooses among the per-KV-head cells of --granularity head; at layer granularity "
            "choose the table's columns with --patterns"
        )


def _model_pool_note(strategy) -> str | None:
    """A line for the layers that pool across layers at run time (kvzip's allocation="model"), which a
    table's per-layer cells do not see."""
    from polykv_search.patterns import make_pattern
    from strategies import PHASES

    counts = {}
    for phase in PHASES:
        choices = [c for c in strategy.phase(phase) if not c.has_head_groups]
        n = sum(make_pattern(c.pattern, **c.params).pooled == "model" for c in choices)
        if n:
            counts[phase] = n
    if not counts:
        return None
    where = " and ".join(f"{n} {phase}" for phase, n in counts.items())
    return (
        f"note: {where} layers use allocation='model'; at run time they rank their tokens as one pool across "
        "layers, which the table's per-layer cells (each pooling its own layer) do not see"
    )


def _list_methods(list_methods, get_solver_class) -> int:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="solvers", expand=True, width=min(out.width, 100))  # ratios need expand
    table.add_column("method", no_wrap=True)
    table.add_column("needs\nsignals")
    table.add_column("description", overflow="fold", ratio=3)
    table.add_column("settings", overflow="fold", ratio=7)  # flags printed whole, folded when too long
    for m in list_methods():
        settings = ""
        if m.available:
            fields = get_solver_class(m.name).Settings.fields_info()
            settings = "\n".join(escape(f"{i.flag}={i.default}") for i in fields)  # kvzip[...] is not markup
        needs = "?" if m.needs_table is None else ("yes" if m.needs_table else "no")
        table.add_row(m.name, needs, m.description if m.available else f"{m.description} ({m.reason})", settings)
    out.print(table)
    return 0
