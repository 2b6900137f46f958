"""`benchmarks/reproduce.py --ablations-on`: the paper's four ablations built on the solver asked for
(planned only: no model is loaded here)."""

from __future__ import annotations

import pytest

ABLATIONS = ("patterns-only", "budgets-only", "prefill-only", "decoding-only")


def solve_steps(reproduce, tmp_path, *extra: str) -> dict[str, list[str]]:
    """Entry name (strategy file stem without ``-B256``) -> the ``solve`` argv that writes it."""
    args = reproduce.parse_args(["--out", str(tmp_path), "--budgets", "256", *extra])
    steps = [s for s in reproduce.plan(args, default="h2o") if s.argv[0] == "solve"]
    return {s.target.stem.removesuffix("-B256"): s.argv for s in steps}


def test_by_default_the_ablations_are_proportionals_under_their_paper_names(reproduce, tmp_path):
    solved = solve_steps(reproduce, tmp_path)
    for name in ABLATIONS:
        assert solved[name][solved[name].index("--method") + 1] == "proportional"
    assert not any(name.startswith("ilp-") for name in solved)


def test_ablations_on_ilp_are_named_for_it_beside_proportionals(reproduce, tmp_path):
    solved = solve_steps(reproduce, tmp_path, "--ablations-on", "proportional,ilp")
    flags = {
        "patterns-only": ["--uniform-budgets"],
        "budgets-only": ["--fixed-pattern", "h2o"],
        "prefill-only": ["--phases", "prefill", "--default-pattern", "h2o"],
        "decoding-only": ["--phases", "decoding", "--default-pattern", "h2o"],
    }
    for name, wanted in flags.items():
        for method, entry in (("proportional", name), ("ilp", f"ilp-{name}")):
            argv = solved[entry]
            assert argv[argv.index("--method") + 1] == method
            i = argv.index(wanted[0])
            assert argv[i : i + len(wanted)] == wanted, entry


def test_the_ilp_ablations_are_scored_with_the_rest(reproduce, tmp_path):
    args = reproduce.parse_args(["--out", str(tmp_path), "--budgets", "256", "--ablations-on", "ilp"])
    (score,) = [s for s in reproduce.plan(args, default="h2o") if s.argv[0] == "score"]
    scored = {p.split("/")[-1] for p in score.argv[score.argv.index("--strategy") + 1 : score.argv.index("--out")]}
    assert {f"ilp-{a}-B256.json" for a in ABLATIONS} <= scored
    assert "patterns-only-B256.json" not in scored  # only the solvers asked for


@pytest.mark.parametrize("value", ["optuna", "pyramid,ilp", ""])
def test_an_unknown_or_empty_ablation_solver_is_one_line_exit_2(reproduce, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as err:
        reproduce.parse_args(["--out", str(tmp_path), "--ablations-on", value])
    assert err.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--ablations-on" in message and "proportional, ilp, dp" in message


def test_uniform_patterns_may_be_specs_with_commas_inside_their_brackets(reproduce, tmp_path):
    spec = "kvzip[allocation=model,n_sink=2]"
    args = reproduce.parse_args(["--out", str(tmp_path), "--budgets", "256", "--patterns", f"snapkv,{spec}"])
    assert args.uniform == ["snapkv", spec]
    steps = solve_steps(reproduce, tmp_path, "--patterns", f"snapkv,{spec}")
    assert steps[f"uniform-{spec}"][steps[f"uniform-{spec}"].index("--pattern") + 1] == spec
