"""Budget plans against brute force, the plan advice arrays, and plan advisors followed through the env."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.advice.plan_advice import EPS, landing_kernels, plan_advice
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.steps.workloads import default_step
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.schedule import ActionCosts, replay
from kdvfs.envs.model.segment_plans import cheapest_within, plan_totals, segment_starts, segments_ok


def tiny(seed: int, kernels: int = 6, actions: int = 3) -> ActionCosts:
    rng = np.random.default_rng(seed)
    return ActionCosts(rng.uniform(1, 3, (kernels, actions)), rng.uniform(1, 3, (kernels, actions)),
                       np.r_[np.arange(1.0, actions), np.nan], np.ones(actions), 0, rng.uniform(0.5, 1.0, actions))


def brute_force(costs: ActionCosts, latency_s: float, stall_s: float, budget_s: float) -> float:
    best = np.inf
    for plan in itertools.product(range(costs.time_s.shape[1]), repeat=costs.kernels):
        actions = np.array(plan)
        outcome = replay(costs, actions, stall_s)
        if segments_ok(costs.time_s, actions, latency_s) and outcome.time_s <= budget_s:
            best = min(best, outcome.energy_j)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_budget_plans_are_feasible_bounded_and_beat_every_single_action(seed: int) -> None:
    costs = tiny(seed)
    latency = 0.0 if seed % 3 == 0 else 3.0
    auto_s = costs.time_s[:, 0].sum()
    budgets = auto_s * np.array([0.9, 1.0, 1.05, 1.2])
    found = cheapest_within(costs, budgets, 0.05, segment_starts(costs.time_s, latency), iterations=30)
    times, energies = plan_totals(costs, found.plans, 0.05)
    singles = [(costs.time_s[:, a].sum(), costs.energy_j[:, a].sum()) for a in range(3)]
    for p, budget in enumerate(budgets):
        optimum = brute_force(costs, latency, 0.05, budget)
        if not found.feasible[p]:
            assert optimum == np.inf
            continue
        assert segments_ok(costs.time_s, found.plans[p], latency)
        assert times[p] <= budget + 1e-9
        assert found.lower_bounds_j[p] - 1e-9 <= optimum <= energies[p] + 1e-9
        assert energies[p] <= min((e for t, e in singles if t <= budget), default=np.inf) + 1e-9


def test_plan_advice_describes_each_plan_from_each_kernel() -> None:
    step = default_step(load_profile("h200"))
    effect = np.minimum(np.arange(step.kernels + 1) + 2, step.kernels)
    advice = plan_advice(step, (0.0, 0.1), effect, latency_s=0.0, stall_s=0.0)
    assert advice.pairs.shape == (step.kernels + 1, 2)
    assert np.all(advice.pairs[-1] == 0) and np.all(advice.rest_pct[-1] == 0)
    for p in range(2):
        plan = advice.pairs[:-1, p]
        time_s, energy_j = (float(x[0]) for x in plan_totals(step.action_costs, plan[None], 0.0))
        assert advice.rest_pct[0, p] == pytest.approx(100 * (1 - energy_j / step.auto_energy_j), abs=1e-4)
        assert advice.rest_pct[0, 2 + p] == pytest.approx(100 * (time_s / step.auto_time_s - 1), abs=1e-4)
        assert advice.rest_pct[0, 2 + p] <= 100 * (0.0, 0.1)[p] + 1e-4
        changes = np.flatnonzero(np.diff(plan)) + 1
        for j in range(step.kernels):
            later = changes[changes > j]
            assert advice.next_change[j, p] == (later[0] if len(later) else step.kernels)
            assert advice.joinable[j, p] == (advice.next_change[j, p] >= effect[j])


def test_following_a_plan_advisor_at_zero_latency_runs_the_plan() -> None:
    profile = load_profile("h200")
    env = KernelDVFSEnv(gpu=profile, latency_s=0.0, latency_noise=False, duration_noise=0.0,
                        plan_budgets=(0.005, 0.01))
    env.reset(seed=0, options={"budget": 0.01})
    plan = env._plans.pairs[:-1, 1]
    advisor = env.advisor_action("plans", 1)
    done, info = False, {}
    while not done:
        _, _, done, _, info = env.step(np.array([1, advisor]))
    np.testing.assert_array_equal(env.applied, env.steps[0].actions[plan])
    step = env.steps[0]
    _, energy_j = plan_totals(step.action_costs, plan[None], 0.0)
    assert info["energy_saved_pct"] == pytest.approx(100 * (1 - energy_j[0] / step.auto_energy_j))
    assert info["slowdown_pct"] <= 1.0 + 1e-9


def test_actions_choose_among_the_plans_and_run_what_the_advisor_proposes() -> None:
    env = KernelDVFSEnv(plan_budgets=(0.005, 0.01, 0.02), decision_fraction=0.0)
    assert env.action_space.nvec.tolist() == [2, 3 + 2]
    assert [env.advisor_action(*named) for named in (("plans", 0), ("plans", 2), ("fitting_plan",), ("budget_plan",))] \
        == [0, 2, 3, 4]
    for group, index in (("budget_plan", 0), ("fitting_plan", 0), ("plans", 2)):
        env.reset(seed=4, options={"budget": 0.01})
        done, action, proposed = False, np.array([1, env.advisor_action(group, index)]), []
        while not done:
            proposed.append(int(env.advice[env.observation_spec.advisor_slots()[group].start + index]))
            assert env.target_pair(action) == proposed[-1]
            done = env.step(action)[2]
        assert set(env.applied.tolist()) <= set(env.steps[0].actions[[0, *proposed]].tolist())
    with pytest.raises(KdvfsError, match="not an action"):
        env.advisor_action("windows")
    with pytest.raises(KdvfsError, match="plan_budgets"):
        KernelDVFSEnv(plan_budgets=())


@pytest.mark.parametrize("seed", range(10))
def test_landing_kernels_against_a_linear_search(seed: int) -> None:
    """For a decision before kernel j: the first kernel starting at or after an early landing (mean latency
    less one spread after kernel j's start; 0 at j = 0), and after a late landing of the next decision
    point's request (the later of the next kernel and one interval on, plus the latency and one spread)."""
    rng = np.random.default_rng(seed)
    times_s = np.concatenate([[0.0], np.cumsum(rng.uniform(0.1, 2.0, 25))])
    latency_s, std_s, interval_s = rng.uniform(0, 4), rng.uniform(0, 1), rng.uniform(0, 2)
    effect, next_effect = landing_kernels(times_s, latency_s, std_s, interval_s)
    kernels = len(times_s) - 1

    def first_at_or_after(time_s: float) -> int:
        return next((k for k in range(kernels + 1) if times_s[k] >= time_s - EPS), kernels)

    for j in range(kernels + 1):
        following_s = max(times_s[min(j + 1, kernels)], times_s[j] + interval_s)
        assert effect[j] == (0 if j == 0 else first_at_or_after(times_s[j] + max(latency_s - std_s, 0.0)))
        assert next_effect[j] == first_at_or_after(following_s + latency_s + std_s)
