"""``noisy_rows``: the shipped H200 policy and every planner over seeded disturbed episodes, on the same draws."""

from __future__ import annotations

import pytest

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.noisy_evaluation import COMPLIANCE, MARGIN_METHOD, MARGINS, RULE_METHOD, noisy_rows, tiled
from kdvfs.agents.learned.policy.policy_planner import PolicyPlanner
from kdvfs.common.paths import shipped_policy_path
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace

METHODS = ("auto", "static", "per-phase", "latency-optimal")


@pytest.fixture(scope="module")
def problem() -> Problem:
    return Problem.build(open_trace("h200/gpt3xl-1layer-b4"), load_profile("h200"), 0.01)


@pytest.fixture(scope="module")
def planner(problem: Problem) -> PolicyPlanner:
    return PolicyPlanner.from_file(shipped_policy_path("h200"), problem.profile)


def test_rows_are_seeded_and_scored_against_auto_on_the_same_draws(problem: Problem, planner: PolicyPlanner) -> None:
    rows = noisy_rows(problem, planner, [0.01, 0.02], 3, 7, METHODS)
    order = [(r.budget, r.method) for r in rows if r.method != MARGIN_METHOD]
    assert order == [(b, m) for b in (0.01, 0.02) for m in ("policy", RULE_METHOD, *METHODS)]
    assert [r.as_json() | {"solve_s": 0} for r in rows] == [
        r.as_json() | {"solve_s": 0} for r in noisy_rows(problem, planner, [0.01, 0.02], 3, 7, METHODS)]
    other = noisy_rows(problem, planner, [0.01], 3, 8, METHODS)
    static, other_static = (next(r for r in found if r.method == "static") for found in (rows, other))
    assert other_static.slowdown_pct != static.slowdown_pct  # other draws
    auto = next(r for r in rows if r.method == "auto")
    assert (auto.energy_saved_pct, auto.slowdown_pct, auto.within_budget) == (0.0, 0.0, 1.0)
    for row in rows:
        assert 0.0 <= row.within_budget <= 1.0 and row.episodes == 3
        assert set(row.as_json()) == {"method", "energy_saved_pct", "slowdown_pct", "switches", "solve_s",
                                      "budget_pct", "within_budget", "episodes", "planned_budget_pct"}


def test_the_margin_tuned_optimum_is_the_best_compliant_multiple(problem: Problem, planner: PolicyPlanner) -> None:
    rows = noisy_rows(problem, planner, [0.01], 6, 0, ("latency-optimal",))
    by_method = {r.method: r for r in rows}
    margin, plain = by_method[MARGIN_METHOD], by_method["latency-optimal"]
    assert margin.within_budget >= COMPLIANCE
    assert any(margin.planned_budget == pytest.approx(0.01 * m) for m in MARGINS)
    if plain.within_budget >= COMPLIANCE:  # the budget itself is one of the multiples
        assert margin.energy_saved_pct >= plain.energy_saved_pct - 1e-12


def test_tiled_costs_repeat_the_step(problem: Problem) -> None:
    run = tiled(problem.costs, 3)
    assert run.kernels == 3 * problem.costs.kernels
    assert run.time_s.sum() == pytest.approx(3 * problem.costs.time_s.sum())
