"""The power-limit method: within the budget, the lowest such limit (brute force), scored like the plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kdvfs.agents.common.problem import Problem, within_budget
from kdvfs.agents.evaluation.compare import EVALUATED, SEARCHED, compare, power_limit_row
from kdvfs.agents.planners.power_limit import POWER_LIMIT, lowest_power_limit
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace

H200 = load_profile("h200")
STEP_W = 5.0


@pytest.fixture(scope="module")
def tiny() -> Problem:
    """The first 40 kernels of the GPT-3 XL layer: GEMMs near the cap and lighter kernels."""
    trace = open_trace("h200/gpt3xl-1layer-b4")
    return Problem.build(replace(trace, kernels=trace.kernels[:40]), H200, 0.01)


def slowdown_pct(problem: Problem, limit_w: float) -> float:
    return 100.0 * (Problem.build(problem.trace, H200, problem.budget, power_limit_w=limit_w).auto.time_s
                    / problem.auto.time_s - 1.0)


@pytest.mark.parametrize("budget", [0.0, 0.01, 0.05, 0.3])
def test_the_chosen_limit_keeps_the_budget_and_is_the_lowest_that_does(tiny: Problem, budget: float) -> None:
    case = tiny.with_budget(budget)
    choice = lowest_power_limit(case, step_w=STEP_W)
    grid = [200.0 + STEP_W * n for n in range(int((700.0 - 200.0) / STEP_W) + 1)]
    keeping = [limit for limit in grid if within_budget(slowdown_pct(case, limit), budget)]
    assert choice.limit_w == min(keeping)
    assert choice.evaluations <= 8 and within_budget(choice.slowdown_pct, budget)
    assert choice.slowdown_pct == pytest.approx(slowdown_pct(case, choice.limit_w), abs=1e-9)


def test_the_row_is_scored_against_auto_at_the_priced_limit(tiny: Problem) -> None:
    row = power_limit_row(tiny.with_budget(0.05))
    priced = Problem.build(tiny.trace, H200, 0.05, power_limit_w=row.power_limit_w).auto
    assert row.power_limit_source == SEARCHED and row.power_limit_w is not None and row.power_limit_w < 700.0
    assert row.executed == row.planned and row.executed.switches == 0 and row.executed.method == POWER_LIMIT
    assert row.executed.energy_saved_pct == pytest.approx(100 * (1 - priced.energy_j / tiny.auto.energy_j), abs=1e-9)
    assert row.executed.energy_saved_pct > 0 and row.executed.slowdown_pct > 0
    assert row.as_json()["power_limit_w"] == row.power_limit_w


def test_below_a_requested_limit_and_beside_static_in_compare(tiny: Problem) -> None:
    lowered = Problem.build(tiny.trace, H200, 0.01, power_limit_w=500.0)
    assert lowest_power_limit(lowered).limit_w <= 500.0
    rows = compare(lowered, [0.01], EVALUATED)
    assert [row.executed.method for row in rows][:3] == ["auto", "static", POWER_LIMIT]
    assert {(row.power_limit_w, row.power_limit_source) for row in rows if row.executed.method != POWER_LIMIT} == \
        {(500.0, "requested")}


def test_an_unreachable_budget_keeps_the_priced_limit(tiny: Problem) -> None:
    high = lowest_power_limit(tiny.with_budget(0.0), step_w=1000.0)
    assert (high.limit_w, high.energy_saved_pct, high.slowdown_pct) == (700.0, 0.0, 0.0)
