"""Solvers that do not chase noise: ilp/dp never profit from cells that look better than FullKV by
chance, report the budget they leave unused, and break ties towards spending it (or saving it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from signals import SignalTable, random_signal_table
from signals.predict import cost_tensor as table_costs
from solvers import Problem, SolverError, solve
from solvers.dp import solve_phase_dp

GRID = (16, 32, 64, 128)
#: the true degradation of every layer, well measured (SE 0.2 / 0.1); 128 is within noise of FullKV
TRUTH = {16: (3.0, 0.2), 32: (1.5, 0.2), 64: (0.6, 0.1), 128: (0.05, 0.1)}


def noisy_table() -> SignalTable:
    """4 layers, snapkv and tova, one phase, 16 (sample, block) units per cell. tova is snapkv + 0.5,
    except in layers 0 and 1 at budget 16, where 2 samples' noise made it look far better than
    FullKV: ΔPPL −2.5 with SE 2.0 (its interval [−6.8, 1.8] cannot tell it from anything)."""
    t = SignalTable.empty(4, ["prefill"], ["snapkv", "tova"], GRID, {"model": "hand"})
    t.set_se_dof(15)
    for layer in range(4):
        t.set_layer(layer, "prefill", entropy=0.5, variance=0.01)
        for b, (value, se) in TRUTH.items():
            for pattern, shift in (("snapkv", 0.0), ("tova", 0.5)):
                dppl, err = value + shift, se
                if pattern == "tova" and b == 16 and layer < 2:
                    dppl, err = -2.5, 2.0
                t.set_cell(
                    layer,
                    "prefill",
                    pattern,
                    b,
                    cosine=1 - dppl / 100,
                    dppl=dppl,
                    kl=max(dppl, 0) / 10,
                    se={"dppl": err, "cosine": err / 100, "kl": err / 10},
                )
    return t


def problem(**kw) -> Problem:
    return Problem(table=noisy_table(), global_budget=64, b_min=16, **kw)  # T = 256 tokens


def choices(result):
    return [(c.pattern, c.budget) for c in result.strategy.phase("prefill")]


def test_the_old_objective_is_misled_by_the_noisy_cells():
    p = problem()
    cost = table_costs(p.table, "prefill", "dppl", range(2), range(4), noise="none")
    old = solve_phase_dp(cost, ["snapkv", "tova"], GRID, p.total)
    assert old.objective < 0  # "better than FullKV"
    assert list(zip(old.patterns, old.budgets))[:2] == [("tova", 16), ("tova", 16)]
    assert sum(old.budgets) < p.total  # and memory left unused


@pytest.mark.parametrize("name", ["ilp", "dp"])
@pytest.mark.parametrize("noise", ["clip", "interval", "upper"])
def test_no_noise_rule_lets_a_cell_cost_less_than_fullkv(name, noise):
    p = problem()
    r = solve(name, p, objective="dppl", noise=noise)
    assert r.objective >= 0
    # the objective is the chosen cells' costs under the rule, each at least 0
    costs = table_costs(p.table, "prefill", "dppl", range(2), range(4), noise=noise)
    chosen = [costs[l, ("snapkv", "tova").index(pat), GRID.index(b)] for l, (pat, b) in enumerate(choices(r))]
    assert min(chosen) >= 0 and math.isclose(r.objective, sum(chosen), abs_tol=1e-9)
    assert r.strategy.provenance["objective_cost"]["noise"] == noise
    assert r.predicted["dppl"] == pytest.approx(
        sum(p.table.cell(l, "prefill", pat, b)[1] for l, (pat, b) in enumerate(choices(r)))
    )


@pytest.mark.parametrize("name", ["ilp", "dp"])
def test_the_upper_bound_does_not_trust_the_noisy_cells_and_spends_the_budget(name):
    r = solve(name, problem(), objective="dppl", noise="upper")
    assert ("tova", 16) not in choices(r)
    assert choices(r) == [("snapkv", 64)] * 4  # 4 x (0.6 + t*0.1) beats any mix with a noisy cell
    assert r.unused_budget == {"prefill": 0, "decoding": 0}
    # clipping only stops rewarding them: they cost what FullKV costs, so they are still taken
    clip = solve(name, problem(), objective="dppl", noise="clip")
    assert choices(clip)[:2] == [("tova", 16), ("tova", 16)] and clip.unused_budget["prefill"] == 32


def test_auto_is_kl_with_upper_bounds_when_the_table_allows_and_dppl_clipped_on_a_version_1_table(tmp_path):
    cost = solve("dp", problem()).strategy.provenance["objective_cost"]
    assert (cost["objective"], cost["noise"]) == ("kl", "upper")
    plain = random_signal_table(4, phases=["prefill"], seed=0)  # KL but no standard errors
    r = solve("dp", Problem(table=plain, global_budget=64))
    assert r.strategy.provenance["objective_cost"]["noise"] == "clip"
    with pytest.raises(SolverError, match="noise: 'interval' needs standard errors"):
        solve("ilp", Problem(table=plain, global_budget=64), noise="interval")


# ------------------------------------------------------------------ tie-break and unused budget
def flat_table(L=4) -> SignalTable:
    """Every cell indistinguishable from FullKV: the signals cannot tell any choice apart."""
    t = random_signal_table(L, phases=["prefill"], patterns=("snapkv", "tova"), budgets=GRID, seed=3)
    t._dppl[...] = 0.0  # noqa: SLF001
    return t


@pytest.mark.parametrize("name", ["ilp", "dp"])
def test_ties_spend_the_budget_or_save_it_as_asked(name):
    p = Problem(table=flat_table(), global_budget=80, b_min=16)  # T = 320
    spend = solve(name, p, objective="dppl", noise="clip")
    assert spend.objective == 0 and sum(spend.strategy.budgets("prefill")) == 320  # e.g. 128+64+64+64
    assert spend.unused_budget["prefill"] == 0
    save = solve(name, p, objective="dppl", noise="clip", tie_break="save")
    assert save.strategy.budgets("prefill") == [16] * 4
    assert save.unused_budget["prefill"] == 320 - 64
    prov = save.strategy.provenance
    assert prov["unused_budget"] == save.unused_budget and prov["budget_total"] == 320
    assert "unused budget per phase of 320: prefill 256" in save.message


def test_a_tie_tolerance_trades_a_little_predicted_cost_for_budget():
    # layer costs fall by 0.01 per doubling: strictly, any saving is "better"; within 0.05 it is a tie
    t = SignalTable.empty(3, ["prefill"], ["snapkv"], GRID)
    for layer in range(3):
        t.set_layer(layer, "prefill", entropy=0.5, variance=0.1)
        for i, b in enumerate(GRID):
            t.set_cell(layer, "prefill", "snapkv", b, cosine=0.9, dppl=0.04 - 0.01 * i)
    p = Problem(table=t, global_budget=48, b_min=16)  # T = 144
    for name in ("ilp", "dp"):
        exact = solve(name, p, objective="dppl", noise="clip", tie_break="save")
        loose = solve(name, p, objective="dppl", noise="clip", tie_break="save", tie_tolerance=0.05)
        assert loose.objective <= exact.objective + 0.05 + 1e-9
        assert sum(loose.strategy.budgets("prefill")) < sum(exact.strategy.budgets("prefill"))
        assert loose.strategy.budgets("prefill") == [16, 16, 16]


def test_ilp_and_dp_agree_on_cost_and_spend_under_every_rule_and_tie_break():
    rng = np.random.default_rng(0)
    for seed in range(40):
        L = int(rng.integers(1, 7))
        grid = sorted(rng.choice(np.arange(4, 90), size=int(rng.integers(1, 5)), replace=False).tolist())
        t = random_signal_table(
            L,
            phases=["prefill"],
            patterns=("snapkv", "tova", "h2o")[: int(rng.integers(1, 4))],
            budgets=grid,
            seed=seed,
            samples=3,
            noise=0.8,
        )
        B = float(rng.uniform(grid[0], grid[-1] + 10))
        settings = dict(
            noise=str(rng.choice(["clip", "interval", "upper"])),
            objective=str(rng.choice(["dppl", "kl", "1-cosine"])),
            tie_break=str(rng.choice(["spend", "save"])),
            tie_tolerance=float(rng.choice([0.0, 0.0, 0.3])),
            max_distinct_budgets=None if seed % 3 else int(rng.integers(1, len(grid) + 1)),
        )
        p = Problem(table=t, global_budget=B, b_min=grid[0])
        a, b = solve("ilp", p, reduce=seed % 2 == 0, **settings), solve("dp", p, **settings)
        assert math.isclose(a.objective, b.objective, abs_tol=1e-6), (seed, settings, a.objective, b.objective)
        assert a.unused_budget == b.unused_budget, (seed, settings)
        assert a.objective >= 0


def test_exact_solvers_refuse_a_kl_objective_on_a_table_without_kl(tmp_path):
    t = random_signal_table(3, seed=0)
    d = t.to_json()
    d["version"] = 1
    for key in ("kl", "uncertainty"):
        d.pop(key)
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(d))
    old = SignalTable.load(path)
    with pytest.raises(SolverError, match="objective: the signal table has no 'kl' signal"):
        solve("dp", Problem(table=old, global_budget=64), objective="kl")
    r = solve("dp", Problem(table=old, global_budget=64))  # auto: dppl, clipped
    assert r.objective >= 0 and r.strategy.provenance["objective_cost"]["objective"] == "dppl"


# ------------------------------------------------------------------ proportional keeps its guarantees
@pytest.mark.parametrize("preference", ["cosine", "ppl", "kl"])
@pytest.mark.parametrize("sensitivity", ["entropy", "ppl", "kl"])
def test_proportional_rounding_b_min_and_max_budget_hold_under_every_setting(preference, sensitivity):
    for seed in range(4):
        t = random_signal_table(7, seed=seed, samples=2, noise=1.0)  # noisy: some ΔPPL below 0
        for cap in (None, 150):
            p = Problem(table=t, global_budget=100, b_min=20, max_budget=cap)
            r = solve("proportional", p, preference=preference, sensitivity=sensitivity)
            for phase in p.phases:
                b = r.strategy.budgets(phase)
                assert sum(b) == p.total and min(b) >= 20 and (cap is None or max(b) <= cap)
                assert r.unused_budget[phase] == 0
