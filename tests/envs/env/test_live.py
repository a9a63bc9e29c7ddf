"""``KernelDVFSEnv.observe_live``: a controller's measured state gives the observation the env simulates."""

from __future__ import annotations

import numpy as np
import pytest

from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.live import LiveState, PredictedElapsed


def test_the_envs_own_state_measured_live_gives_its_own_observation() -> None:
    """Without disturbances and with ideal switching the env's state is (kernel, pairs, elapsed, auto time of
    the kernels run): the same state given live reproduces each observation, and the episode goes on."""
    env = KernelDVFSEnv(gpu="h200", config=EnvConfig().without_disturbances(), latency_scales=(0.0,),
                        plan_budgets=(0.005, 0.01))
    observation, _ = env.reset(seed=3, options={"budget": 0.01})
    step = env.steps[0]
    assert np.array_equal(env.observe_live(LiveState(0, 0, -1, 0.0, 0.0, 0.0)), observation)
    rng, elapsed_s, checked = np.random.default_rng(0), 0.0, 0
    done = False
    while not done:
        observation, _, done, _, info = env.step(np.array([1, rng.integers(env.action_space.nvec[1])]))
        elapsed_s += info["time_s"]
        kernel, in_effect, pending = env.clocks
        if done or pending >= 0:
            continue
        live = LiveState(kernel, in_effect, pending, 0.0, elapsed_s, float(step.cumulative[kernel, 0, 0]),
                         model_elapsed_s=env.model_elapsed_s)
        assert np.allclose(env.observe_live(live), observation, atol=1e-5)
        checked += 1
    assert checked > 10


def test_a_live_state_over_its_time_shows_the_budget_used() -> None:
    env = KernelDVFSEnv(gpu="h200", plan_budgets=(0.005, 0.01))
    env.reset(seed=0, options={"budget": 0.01})
    spec, step = env.observation_spec, env.steps[0]
    kernel = step.kernels // 2
    auto_s = float(step.cumulative[kernel, 0, 0])
    on_time = spec.view(env.observe_live(LiveState(kernel, 0, -1, 0.0, auto_s, auto_s)), "budget")
    late = spec.view(env.observe_live(LiveState(kernel, 0, -1, 0.0, auto_s + 0.005 * step.auto_time_s, auto_s)),
                     "budget")
    assert on_time[1] == 0.0 and np.isclose(late[1], 0.5, atol=1e-5)  # half the 1% budget used
    assert late[2] < on_time[2]  # less slowdown still affordable
    drift = spec.view(env.observe_live(LiveState(kernel, 0, -1, 0.0, auto_s, auto_s, 1.5, 2.0)), "conditions")
    assert np.allclose(drift[[1, 3]], [2.0, 1.5])  # drift (%) and the last latency ratio, as measured


def _plan_env() -> KernelDVFSEnv:
    return KernelDVFSEnv(gpu="h200", config=EnvConfig().without_disturbances(), plan_actions=True,
                         plan_budgets=(0.0, 0.005, 0.01, 0.02), decision_latencies=0.1)


def test_the_dynamic_observation_is_the_live_observation_after_its_static_part() -> None:
    env = _plan_env()
    env.reset(seed=0, options={"budget": 0.01})
    step, size = env.steps[0], env.observation_spec.static_size
    for kernel in (0, 7, step.kernels // 2, step.kernels - 1):
        auto_s = float(step.cumulative[kernel, 0, 0])
        state = LiveState(kernel, 3, -1, 0.0, 1.003 * auto_s, auto_s)
        full = env.observe_live(state)
        assert np.array_equal(env.observe_live_dynamic(state), full[size:])
        assert np.array_equal(env.static_rows[kernel], full[:size])


def test_a_plans_proposal_holds_until_the_next_change_the_env_names() -> None:
    """Brute force: the pair a plan order names, read at every kernel with the clocks in effect unchanged,
    differs from the one before exactly at the kernels ``next_proposal_change`` names."""
    env = _plan_env()
    env.reset(seed=0, options={"budget": 0.01})
    step, plans = env.steps[0], len(env.observation_spec.plan_budgets)
    seen = 0
    for in_effect in (0, 5):
        for choice in (*range(plans), plans + 1):  # each plan, then the budget's plan
            action = np.array([1, choice])

            def proposal(kernel: int, action: np.ndarray = action, in_effect: int = in_effect) -> int:
                auto_s = float(step.cumulative[kernel, 0, 0])
                env.observe_live(LiveState(kernel, in_effect, -1, 0.0, auto_s, auto_s))
                return env.target_pair(action)

            pairs = [proposal(k) for k in range(step.kernels)]
            changes = [k for k in range(1, step.kernels) if pairs[k] != pairs[k - 1]]
            named = []
            proposal(0)
            while (change := env.next_proposal_change(action)) is not None and change < step.kernels:
                named.append(change)
                proposal(change)
            assert named == changes
            seen += len(changes)
    assert seen > 0


def test_orders_that_depend_on_the_budget_have_no_known_next_change() -> None:
    env = _plan_env()
    env.reset(seed=0, options={"budget": 0.01})
    plans = len(env.observation_spec.plan_budgets)
    assert env.next_proposal_change(np.array([1, plans])) is None  # the fitting plan
    assert env.next_proposal_change(np.array([0, 0])) == env.steps[0].kernels  # no request


def test_readings_at_each_change_give_the_predictions_time_at_the_clocks_run() -> None:
    """With ideal switching a change lands where it is requested: a controller reading (kernel, pair in effect)
    there and at every decision point accumulates exactly what the environment counts."""
    env = KernelDVFSEnv(gpu="h200", config=EnvConfig().without_disturbances(), latency_scales=(0.0,),
                        plan_budgets=(0.01,))
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
        assert predicted.at(kernel, in_effect) == pytest.approx(env.model_elapsed_s, rel=1e-9)
    assert changes > 2
    assert predicted.at(kernel - 5, in_effect) == predicted.seconds  # never back a kernel


def test_a_change_of_pair_adds_one_stall_and_kernels_count_at_the_pair_of_the_earlier_reading() -> None:
    predicted = PredictedElapsed(np.array([[0.0, 0.0], [1.0, 2.0], [3.0, 5.0], [6.0, 9.0]]), 0.5)
    assert [predicted.at(0, 0), predicted.at(2, 0), predicted.at(2, 1), predicted.at(3, 1)] == [0.0, 3.0, 3.5, 7.5]
    assert predicted.at(1, 1) == 7.5
    predicted.restart()
    assert predicted.at(1, 1) == 2.0  # the first reading's pair ran from the start, no stall
