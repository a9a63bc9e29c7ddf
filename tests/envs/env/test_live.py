"""What a controller measures (``LiveState``, ``PredictedElapsed``) and the environment's own state in those
terms (``KernelDVFSEnv.live_state``): the observation of either is ``observe_at``'s."""

from __future__ import annotations

import numpy as np
import pytest

from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.live import LiveState, PredictedElapsed
from kdvfs.envs.env.observing.live_tables import plans_at
from tests.envs.env.env_doubles import PREVIOUS, PairEnv, observe_state


def test_the_envs_observation_is_that_of_its_live_state() -> None:
    """Every observation of an episode (drift, jitter, noise, latency spread on) is the one a controller
    measuring the env's live state observes: the same function on the same state."""
    env = KernelDVFSEnv(gpu="h200", plan_budgets=(0.005, 0.01), budgets=(0.01,))
    observation, _ = env.reset(seed=3)
    rng, done, pending = np.random.default_rng(0), False, 0
    while not done:
        state = env.live_state()
        assert np.array_equal(observe_state(env, state), observation)
        pending += state.pending >= 0
        observation, _, done, _, _ = env.step(np.array([rng.integers(2), rng.integers(env.action_space.nvec[1])]))
    assert pending > 0


def test_a_live_state_over_its_time_shows_the_budget_used() -> None:
    env = KernelDVFSEnv(gpu="h200", plan_budgets=(0.005, 0.01))
    env.reset(seed=0, options={"budget": 0.01})
    spec, step = env.observation_spec, env.steps[0]
    kernel = step.kernels // 2
    auto_s = float(step.cumulative[kernel, 0, 0])
    on_time = spec.view(observe_state(env, LiveState(kernel, 0, -1, 0.0, auto_s, auto_s)), "budget")
    late = spec.view(observe_state(env, LiveState(kernel, 0, -1, 0.0, auto_s + 0.005 * step.auto_time_s, auto_s)),
                     "budget")
    assert on_time[1] == 0.0 and np.isclose(late[1], 0.5, atol=1e-5)  # half the 1% budget used
    assert late[2] < on_time[2]  # less slowdown still affordable
    drift = spec.view(observe_state(env, LiveState(kernel, 0, -1, 0.0, auto_s, auto_s, 1.5, 2.0)), "conditions")
    assert np.allclose(drift[[1, 3]], [2.0, 1.5])  # drift (%) and the last latency ratio, as measured


def test_readings_at_each_change_give_the_predictions_time_at_the_clocks_run() -> None:
    """With ideal switching a change lands where it is requested: a controller reading (kernel, pair in effect)
    there and at every decision point accumulates exactly what the environment counts."""
    env = PairEnv(gpu="h200", config=PREVIOUS.without_disturbances(), latency_scales=(0.0,), plan_budgets=(0.01,))
    env.reset(seed=2, options={"budget": 0.01})
    predicted = PredictedElapsed(env.steps[0].cumulative[:, 0, :], env.stall_s)
    rng, done, changes, kernel = np.random.default_rng(1), False, 0, 0
    predicted.at(0, 0)
    while not done:
        before = env.clocks[1]
        _, _, done, _, _ = env.step(np.array([int(rng.random() < 0.3), rng.integers(env.grid.size)]))
        in_effect = env.clocks[1]
        if in_effect != before:
            changes += 1
            predicted.at(kernel, in_effect)
        kernel = env.clocks[0]
        assert predicted.at(kernel, in_effect) == pytest.approx(env.live_state().model_elapsed_s, rel=1e-9)
    assert changes > 2
    assert predicted.at(kernel - 5, in_effect) == predicted.seconds  # never back a kernel


def test_a_change_of_pair_adds_one_stall_and_kernels_count_at_the_pair_of_the_earlier_reading() -> None:
    predicted = PredictedElapsed(np.array([[0.0, 0.0], [1.0, 2.0], [3.0, 5.0], [6.0, 9.0]]), 0.5)
    assert [predicted.at(0, 0), predicted.at(2, 0), predicted.at(2, 1), predicted.at(3, 1)] == [0.0, 3.0, 3.5, 7.5]
    assert predicted.at(1, 1) == 7.5
    predicted.restart()
    assert predicted.at(1, 1) == 2.0  # the first reading's pair ran from the start, no stall


def test_the_plans_alone_are_what_the_observation_says_of_them() -> None:
    """``plans_at`` (what a controller's look-ahead reads of the budget-dependent proposals) writes every plan
    advisor's pair (the plans', the fitting plan's, the budget plan's) and their blocks as ``observe_at`` does, at
    states along a step, some where the budget holds the fitting plan below the most saving one and some not."""
    env = KernelDVFSEnv(gpu="h200", plan_budgets=(0.0025, 0.005, 0.01, 0.02), budgets=(0.005, 0.01))
    spec, rng, binds = env.observation_spec, np.random.default_rng(5), []
    slots = spec.advisor_slots()
    plan_slots = np.r_[slots["plans"], slots["fitting_plan"], slots["budget_plan"]]
    blocks = ("plans_rest_saving_then_slowdown_pct", "plans_in_effect", "fitting_plan", "budget_plan")
    for seed in range(3):
        env.reset(seed=seed)
        step = env.steps[0]
        for _ in range(40):
            kernel = int(rng.integers(0, step.kernels + 1))
            in_effect = int(rng.integers(env.grid.size))
            auto_s = float(step.cumulative[kernel, 0, 0])
            state = LiveState(kernel, in_effect, -1, 0.0, auto_s * rng.uniform(0.98, 1.02), auto_s, 1.0, 0.0,
                              auto_s * rng.uniform(0.99, 1.01))
            observation = observe_state(env, state)
            expected = env.advice[plan_slots].copy()
            tables = env.live_tables()
            env.advice[:] = -7
            plans_at(tables.obs, env.advice, tables.layout, tables.cumulative_s, tables.landings, tables.plan_pairs,
                     tables.plan_rest, tables.joinable, tables.next_change, tables.speeds_up, tables.sizes,
                     tables.auto_time_s, tables.stall_s, env.budget, env.budget_plan, *state[:2], *state[4:6],
                     state[8])
            assert np.array_equal(env.advice[plan_slots], expected)
            for block in blocks:
                assert np.array_equal(spec.view(tables.obs, block), spec.view(observation, block))
            savings = spec.view(observation, "plans_rest_saving_then_slowdown_pct")[:len(spec.plan_budgets)]
            binds.append(bool(spec.view(observation, "fitting_plan")[0] < savings.max()))
    assert 10 <= sum(binds) <= len(binds) - 10
