"""``KernelDVFSEnv.observe_live``: a controller's measured state gives the observation the env simulates."""

from __future__ import annotations

import numpy as np

from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.live import LiveState


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
        live = LiveState(kernel, in_effect, pending, 0.0, elapsed_s, float(step.cumulative[kernel, 0, 0]))
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
