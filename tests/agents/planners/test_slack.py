"""Slack-aware planning of torchrun ranks under one job budget: a rank that waits at a collective is planned
slower, and every rank's time on the job's critical path stays within the job's step time x (1 + budget)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from kdvfs.agents.common.problem import Problem, outcome_of, rank_budget, rank_slack_s
from kdvfs.agents.planners.latency_optimal import LatencyOptimal
from kdvfs.agents.planners.static_plans import IlpGlobal
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.schedule import ActionCosts, replay
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Category, Kernel, Trace

H200 = load_profile("h200")
BUDGET = 0.01


def with_collective(compute: tuple[Kernel, ...], like: Kernel, communication_s: float) -> tuple[Kernel, ...]:
    collective = replace(like, name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL", category=Category.COMMUNICATION,
                         duration_s=communication_s, gap_before_s=0.0, op=None, features=None, flops=None,
                         dram_bytes=None)
    return (*compute, collective)


def two_ranks(trace: Trace, transfer_s: float, wait_s: float) -> tuple[Trace, Trace]:
    """Rank 0, the slowest: ``trace`` then an all-reduce of ``transfer_s``; rank 1: the same step with its
    kernels ``wait_s`` shorter in total, so it waits ``wait_s`` longer in the all-reduce (steps equal)."""
    scale = 1.0 - wait_s / trace.busy_s
    faster = tuple(replace(k, duration_s=k.duration_s * scale) for k in trace.kernels)
    ranks = []
    for rank, (kernels, communication_s) in enumerate(((trace.kernels, transfer_s), (faster, transfer_s + wait_s))):
        step = replace(trace, kernels=with_collective(kernels, trace.kernels[-1], communication_s))
        measurements = {"world_size": 2.0, "rank": float(rank), "job_step_time_s": trace.step_time_s + transfer_s,
                        "job_max_noncommunication_s": trace.step_time_s}
        ranks.append(replace(step, meta=replace(step.meta, measurements=measurements)))
    return ranks[0], ranks[1]


def test_the_slowest_rank_has_no_slack_and_a_waiting_one_its_wait() -> None:
    base = open_trace("h200/gpt2s-b16")
    base = replace(base, meta=replace(base.meta, measurements={}))
    slowest, waiting = two_ranks(base, 2e-3, 4e-3)
    assert rank_slack_s(slowest) == 0.0 and rank_budget(slowest, BUDGET) == pytest.approx(BUDGET)
    assert rank_slack_s(waiting) == pytest.approx(4e-3)
    step_s = waiting.step_time_s
    assert rank_budget(waiting, BUDGET) == pytest.approx((4e-3 + BUDGET * step_s) / step_s)
    alone = replace(waiting, meta=replace(waiting.meta, measurements={**waiting.meta.measurements, "world_size": 1.0}))
    assert rank_slack_s(alone) == 0.0 and rank_budget(alone, BUDGET) == BUDGET


@pytest.fixture(scope="module")
def ranks() -> tuple[Trace, Trace]:
    base = open_trace("h200/gpt3xl-1layer-b4")
    base = replace(base, meta=replace(base.meta, measurements={}))
    return two_ranks(base, 0.02 * base.step_time_s, 0.05 * base.step_time_s)


@pytest.mark.parametrize("planner", [IlpGlobal(), LatencyOptimal()], ids=["ilp", "latency-optimal"])
def test_a_waiting_rank_runs_slower_for_less_energy_and_the_job_stays_within_its_budget(
        ranks: tuple[Trace, Trace], planner: IlpGlobal | LatencyOptimal) -> None:
    job_s = ranks[0].meta.measurements["job_step_time_s"]
    saved = {}
    for trace in ranks:
        problem = Problem.build(trace, H200, rank_budget(trace, BUDGET))
        outcome = outcome_of(problem, planner.plan(problem), ideal=isinstance(planner, IlpGlobal))
        assert outcome.time_s - rank_slack_s(trace) <= job_s * (1 + BUDGET) * (1 + 1e-9)
        saved[trace.meta.measurements["rank"]] = (outcome, problem.auto)
    plain = Problem.build(ranks[1], H200, BUDGET)
    unslacked = outcome_of(plain, planner.plan(plain), ideal=isinstance(planner, IlpGlobal))
    slacked, auto = saved[1.0]
    assert slacked.energy_j < unslacked.energy_j and slacked.time_s > unslacked.time_s
    assert 1 - slacked.energy_j / auto.energy_j > 1 - saved[0.0][0].energy_j / saved[0.0][1].energy_j


def test_the_ilp_puts_a_collective_at_its_cheapest_clocks(ranks: tuple[Trace, Trace]) -> None:
    problem = Problem.build(ranks[1], H200, rank_budget(ranks[1], BUDGET))
    action = IlpGlobal().plan(problem).actions[-1]
    assert problem.costs.energy_j[-1, action] == pytest.approx(problem.costs.energy_j[-1].min(), rel=1e-6)


def few_actions(problem: Problem, every: int) -> Problem:
    """``problem`` with every ``every``-th locked pair and auto only (brute force stays small)."""
    costs = problem.costs
    columns = [*range(0, costs.auto_index, every), costs.auto_index]
    return replace(problem, costs=ActionCosts(costs.time_s[:, columns], costs.energy_j[:, columns],
                                              costs.core_mhz[columns], costs.mem_mhz[columns], len(columns) - 1,
                                              costs.idle_power_w[columns]))


def brute_force_j(problem: Problem) -> float:
    costs = problem.costs
    plans = itertools.product(range(costs.time_s.shape[1]), repeat=costs.kernels)
    outcomes = (replay(costs, np.array(plan), 0.0) for plan in plans)
    return min(o.energy_j for o in outcomes if o.time_s <= problem.budget_s)


def test_planners_equal_brute_force_on_a_tiny_rank_with_slack() -> None:
    base = open_trace("h200/gpt3xl-1layer-b4")
    gemm = next(k for k in base.kernels if k.category is Category.GEMM)
    elementwise = next(k for k in base.kernels if k.category is Category.ELEMENTWISE)
    tiny = replace(base, meta=replace(base.meta, measurements={}), kernels=(gemm, elementwise))
    _, waiting = two_ranks(tiny, 0.2 * tiny.busy_s, 0.3 * tiny.busy_s)
    problem = few_actions(Problem.build(waiting, H200, rank_budget(waiting, BUDGET), latency_s=0.0), 12)
    optimum_j = brute_force_j(problem)
    assert optimum_j < brute_force_j(replace(problem, budget=BUDGET))
    ilp = outcome_of(problem, IlpGlobal().plan(problem), ideal=True)
    assert ilp.energy_j == pytest.approx(optimum_j, rel=1e-9) and ilp.time_s <= problem.budget_s
    schedule = LatencyOptimal().plan(problem)  # exact up to its certified Lagrangian gap
    latency_optimal = outcome_of(problem, schedule)
    assert latency_optimal.time_s <= problem.budget_s
    assert optimum_j - 1e-12 <= latency_optimal.energy_j <= optimum_j + schedule.info["gap_j"] + 1e-12
