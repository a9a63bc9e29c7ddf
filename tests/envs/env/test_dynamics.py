"""The environment's disturbances: each off gives the previous behaviour exactly, seeded draws, runs of steps,
and fixed schedules executed open-loop through the same draws."""

from __future__ import annotations

import hashlib
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from kdvfs.agents.common.problem import Problem
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import ENV_ID, KernelDVFSEnv
from kdvfs.envs.env.dynamics import Disturbances, execute_open_loop
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.schedule import execute
from kdvfs.envs.trace.bundled import open_trace
from tests.envs.env.env_doubles import FINE_CORE_FRACTIONS, PREVIOUS, PairEnv

FAST_SWITCHING = {"latency_s": 0.0005, "latency_std_s": 0.0002, "stall_s": 1e-5}
# Golden episodes of the environment with drift, step jitter and runs switched off (random actions, seeds
# 0-3): return, switches, sha256 of the observations and of env.applied (first 16 hex digits). A change of
# the shipped profile's prices or of the observation layout changes the observations' digest; the returns,
# switches and clocks that ran (last column) must not move when those features are off.
BEFORE = {
    False: [(-161.54545418097317, 1, "eb62bb319cd714fd", "3cfcdeb2937b87d6"),
            (-5.961551552722673, 1, "d72aa927ea530691", "2ffac5e7c8a8cc8b"),
            (-501.523093622859, 0, "120af2196c9ef017", "48d522e14dd07821"),
            (-474.18674913784594, 0, "900bbc87c65e45e4", "604e8c3d35c70ae2")],
    True: [(-187.8615088890559, 10, "6905feda132986c8", "93cd334c28925f21"),
           (-237.43537610775297, 7, "704c4ad3534b7875", "2b5725b610a97bd8"),
           (-323.57484942926527, 11, "c61da949ccc36616", "428a5fb33b868adf"),
           (-310.68210440574427, 11, "b59c3a94524749d6", "dd94ec94f11dcced")],
}


def _random_episode(env: KernelDVFSEnv, seed: int) -> tuple[float, int, str, str]:
    observation, _ = env.reset(seed=seed)
    rng, total, done = np.random.default_rng(seed), 0.0, False
    digest = hashlib.sha256(observation.tobytes())
    while not done:
        observation, reward, done, _, _ = env.step(np.array([rng.integers(2), rng.integers(env.action_space.nvec[1])]))
        total += reward
        digest.update(observation.tobytes())
    return (total, env.episode_summary()["switches"], digest.hexdigest()[:16],
            hashlib.sha256(env.applied.tobytes()).hexdigest()[:16])


@pytest.mark.parametrize("fast", [False, True])
def test_new_disturbances_off_give_the_previous_environment_exactly(fast: bool) -> None:
    env = PairEnv(config=PREVIOUS, plan_budgets=(0.005, 0.01, 0.02), budgets=(0.005, 0.01, 0.02),
                  **(FAST_SWITCHING if fast else {}))  # type: ignore[arg-type]
    for seed, (total, switches, observations, applied) in enumerate(BEFORE[fast]):
        got = _random_episode(env, seed)
        assert got[0] == pytest.approx(total, rel=1e-12, abs=1e-12)
        assert got[1:] == (switches, observations, applied)


@pytest.fixture(scope="module")
def problem() -> Problem:
    return Problem.build(open_trace("h200/gpt3xl-1layer-b4"), load_profile("h200"), 0.01)


@pytest.fixture(scope="module")
def step(problem: Problem) -> StepData:
    return StepData.from_costs("layer", problem.trace, problem.costs,
                               ClockGrid.for_profile(problem.profile, FINE_CORE_FRACTIONS))


def _constant(env: KernelDVFSEnv, grid_action: int, seed: int) -> dict:
    env.reset(seed=seed)
    done = False
    while not done:
        _, _, done, _, info = env.step(np.array([1, grid_action]))
    return info


@pytest.mark.parametrize("setting", ["drift", "step_jitter"])
def test_each_disturbance_is_seeded_and_changes_the_outcome(problem: Problem, step: StepData,
                                                          setting: str) -> None:
    base = PREVIOUS.replace(latency_noise=False, duration_noise=0.0, run_steps=3)
    quiet = PairEnv([step], problem.profile, base)
    noisy = PairEnv([step], problem.profile, base.replace(**{setting: True}))
    locked = (step.grid.levels - 1) * len(step.grid.memory_mhz)  # the lowest locked core level: overruns
    assert _constant(noisy, locked, 5) == _constant(noisy, locked, 5)
    assert _constant(noisy, locked, 5) != _constant(noisy, locked, 6)
    assert _constant(noisy, locked, 5)["overrun_pct"] != pytest.approx(_constant(quiet, locked, 5)["overrun_pct"])
    if setting == "drift":  # auto slows down with the drift, a locked clock does not
        assert noisy.disturbances.time_auto is not None and noisy.disturbances.time_locked is not None
        assert np.all(noisy.disturbances.time_auto >= noisy.disturbances.time_locked)
        assert _constant(noisy, locked, 5)["slowdown_pct"] < _constant(quiet, locked, 5)["slowdown_pct"]


def test_a_run_holds_the_budget_over_its_steps(problem: Problem, step: StepData) -> None:
    single = PairEnv([step], problem.profile, PREVIOUS.without_disturbances())
    run = PairEnv([step], problem.profile, PREVIOUS.replace(run_steps=4).without_disturbances())
    locked = 20 * len(step.grid.memory_mhz)
    one, four = _constant(single, locked, 0), _constant(run, locked, 0)
    assert len(run.applied) == 4 * step.kernels
    assert four["slowdown_pct"] == pytest.approx(one["slowdown_pct"], rel=1e-9)
    assert four["overrun_pct"] == pytest.approx(one["overrun_pct"], rel=1e-9)  # % of the run's auto time
    assert run.observation_space.shape == single.observation_space.shape


def test_slack_of_a_fast_step_pays_for_a_slow_one(problem: Problem, step: StepData) -> None:
    config = PREVIOUS.replace(run_steps=2, latency_s=0.0, budgets=(0.01,)).without_disturbances()
    env = PairEnv([step], problem.profile, config)
    one_step = PairEnv([step], problem.profile, config.replace(run_steps=1))
    pairs = range(len(step.grid.memory_mhz), step.grid.size, len(step.grid.memory_mhz))
    slow = next(g for g in pairs if 1.2 < _constant(one_step, g, 0)["slowdown_pct"] < 2.0)
    alone = _constant(one_step, slow, 0)
    assert alone["overrun_pct"] > 0  # one slow step overruns its own budget
    env.reset(seed=0)
    done = False
    while not done:  # the slow pair for the first step, auto for the second
        _, _, done, _, info = env.step(np.array([1, slow if env.clocks[0] < step.kernels else 0]))
    assert info["slowdown_pct"] == pytest.approx(alone["slowdown_pct"] / 2, rel=0.05)
    assert info["overrun_pct"] == 0.0


def test_every_disturbance_on_passes_the_checkers() -> None:
    env = gym.make(ENV_ID, run_steps=2, plan_budgets=(0.005, 0.01), drift=True, step_jitter=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gymnasium_check_env(env.unwrapped)
        sb3_check_env(env.unwrapped)


def test_settings_are_checked() -> None:
    for bad in ({"run_steps": 0}, {"drift_pct": -1.0}, {"drift_s": 0.0}, {"run_start_s": -1.0}):
        with pytest.raises(KdvfsError):
            EnvConfig(**bad)  # type: ignore[arg-type]


def test_open_loop_without_disturbances_is_execute(problem: Problem) -> None:
    actions = np.full(problem.costs.kernels, problem.costs.auto_index)
    actions[len(actions) // 3: 2 * len(actions) // 3] = 0
    none = Disturbances(None, None, None, None, problem.latency_s)
    expected = execute(problem.costs, actions, problem.latency_s, problem.stall_s)
    got = execute_open_loop(problem.costs, actions, none, problem.stall_s)
    assert (got.time_s, got.energy_j, got.switches) == pytest.approx(
        (expected.time_s, expected.energy_j, expected.switches), rel=1e-12)
    assert np.array_equal(got.applied, expected.applied)


def test_open_loop_follows_the_drawn_latencies_and_costs(problem: Problem) -> None:
    actions = np.full(problem.costs.kernels, problem.costs.auto_index)
    actions[len(actions) // 10:] = 0
    kernels = problem.costs.kernels
    late = Disturbances(None, None, np.full(kernels, 1.1), np.full(kernels, 1.5 * problem.latency_s),
                        problem.latency_s)
    on_time = execute(problem.costs, actions, problem.latency_s, problem.stall_s)
    got = execute_open_loop(problem.costs, actions, late, problem.stall_s)
    assert np.flatnonzero(got.applied == 0)[0] > np.flatnonzero(on_time.applied == 0)[0]  # took effect later
    priced = late.apply(problem.costs)
    rows = np.arange(kernels)
    assert got.energy_j == pytest.approx(float(priced.energy_j[rows, got.applied].sum())
                                         + problem.stall_s * float(problem.costs.idle_power_w[0]), rel=1e-12)


def test_under_drift_a_locked_clock_above_the_limiters_is_throttled_to_it() -> None:
    env = KernelDVFSEnv(drift=True, duration_noise=0.0, latency_noise=False)
    env.reset(seed=0)
    drawn = env.disturbances
    assert drawn.time_auto is not None and drawn.time_locked is not None
    drift = drawn.time_auto / drawn.time_locked
    factors = drawn.locked_factors(np.array([1.0, 0.9, 1.0 / drift.max()]))
    assert factors is not None
    np.testing.assert_allclose(factors[:, 0], drawn.time_auto)  # the top clock drifts like auto
    np.testing.assert_allclose(factors[:, 2], drawn.time_locked)  # at or below the limiter's: no drift
    assert np.all(factors[:, 1] >= drawn.time_locked) and np.all(factors[:, 1] <= drawn.time_auto)
