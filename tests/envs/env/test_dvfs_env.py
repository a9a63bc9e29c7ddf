"""KernelDVFS-v0: the env checkers, seeded determinism, and energy/time accounting against the cost model."""

from __future__ import annotations

import warnings
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from kdvfs.agents.common.problem import Problem, score
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.dvfs_env import ENV_ID, KernelDVFSEnv
from kdvfs.envs.env.observing.observation import ObservationSpec, static_observations
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.schedule import Schedule, execute, replay
from kdvfs.envs.trace.bundled import open_trace
from tests.envs.env.env_doubles import FINE_CORE_FRACTIONS, FINE_GRID, PREVIOUS, PairEnv

TRACE = "h200/gpt3xl-1layer-b4"


@pytest.fixture(scope="module")
def problem() -> Problem:
    return Problem.build(open_trace(TRACE), load_profile("h200"), 0.01)


@pytest.fixture(scope="module")
def step(problem: Problem) -> StepData:
    grid = ClockGrid.for_profile(problem.profile, FINE_CORE_FRACTIONS)
    return StepData.from_costs("layer", problem.trace, problem.costs, grid)


def exact_env(problem: Problem, step: StepData, **kwargs: object) -> KernelDVFSEnv:
    """The env with the problem's latency and stall, no noise, its actions grid pairs (:class:`PairEnv`)."""
    return PairEnv([step], problem.profile, PREVIOUS, budgets=(problem.budget,), latency_s=problem.latency_s,
                   stall_s=problem.stall_s, latency_noise=False, duration_noise=0.0, **kwargs)  # type: ignore[arg-type]


def run(env: KernelDVFSEnv, actions: list[np.ndarray] | None = None, seed: int = 0) -> tuple[float, dict]:
    """One episode: the given actions in turn (the last one repeated), or random ones; (return, last info)."""
    env.reset(seed=seed)
    rng, total, done, i = np.random.default_rng(seed), 0.0, False, 0
    while not done:
        action = actions[min(i, len(actions) - 1)] if actions else np.array(
            [rng.random() < 0.3, rng.integers(env.grid.size)])
        _, reward, done, _, info = env.step(action)
        total, i = total + reward, i + 1
    return total, info


@pytest.mark.parametrize("kwargs", [{}, {"plan_budgets": (0.005, 0.01, 0.02)}])
def test_passes_gymnasium_and_sb3_checkers_without_warnings(kwargs: dict[str, object]) -> None:
    env = gym.make(ENV_ID, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gymnasium_check_env(env.unwrapped)
        sb3_check_env(env.unwrapped)


def test_seeded_rollouts_are_identical(step: StepData, problem: Problem) -> None:
    def rollout(seed: int) -> list[tuple]:
        env = KernelDVFSEnv([step, replace(step, name="other")], problem.profile, budgets=(0.01, 0.02),
                            plan_budgets=(0.005, 0.01), **FINE_GRID)  # type: ignore[arg-type]
        observation, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        history, done = [observation], False
        while not done:
            observation, reward, done, _, info = env.step(env.action_space.sample())
            history.append((observation.tobytes(), reward, sorted(info.items())))
        return history[1:]

    assert rollout(3) == rollout(3)
    assert rollout(3) != rollout(4)


def test_all_auto_saves_nothing_even_with_noise(step: StepData, problem: Problem) -> None:
    env = KernelDVFSEnv([step], problem.profile, **FINE_GRID)  # type: ignore[arg-type]
    total, info = run(env, [np.array([0, 0])])  # never requests
    assert info["energy_saved_pct"] == pytest.approx(0.0, abs=1e-9)
    assert info["slowdown_pct"] == pytest.approx(0.0, abs=1e-9)
    assert total == pytest.approx(0.0, abs=1e-9) and info["switches"] == 0


def test_constant_locked_action_equals_the_cost_model(step: StepData, problem: Problem) -> None:
    grid_action = 5 * len(step.grid.memory_mhz)  # core level 5 at the highest memory clock, held throughout
    _, info = run(exact_env(problem, step), [np.array([1, grid_action])])
    expected = score(problem, Schedule(np.full(problem.costs.kernels, step.actions[grid_action]), "constant"))
    assert info["energy_saved_pct"] == pytest.approx(expected.energy_saved_pct, rel=1e-9)
    assert info["slowdown_pct"] == pytest.approx(expected.slowdown_pct, rel=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_random_episode_equals_replay_of_the_clocks_that_ran(step: StepData, problem: Problem, seed: int) -> None:
    env = exact_env(problem, step)
    total, info = run(env, seed=seed)
    outcome = replay(problem.costs, env.applied, problem.stall_s)
    auto = problem.auto
    assert info["switches"] == outcome.switches
    assert info["energy_saved_pct"] == pytest.approx(100 * (1 - outcome.energy_j / auto.energy_j), abs=1e-9)
    assert info["slowdown_pct"] == pytest.approx(100 * (outcome.time_s / auto.time_s - 1), abs=1e-9)
    overrun = max(0.0, info["slowdown_pct"] - 100 * problem.budget)
    assert total == pytest.approx(info["energy_saved_pct"] - env.config.overrun_penalty * overrun, abs=1e-9)


def test_ideal_switching_applies_every_request_at_once(step: StepData, problem: Problem) -> None:
    ideal = problem.__class__.build(open_trace(TRACE), problem.profile, 0.01, latency_s=0.0)
    env = exact_env(ideal, step)
    rng = np.random.default_rng(0)
    targets = rng.integers(0, step.grid.size, problem.costs.kernels)
    env.reset(seed=0)
    for target in targets:
        env.step(np.array([1, target]))
    assert np.array_equal(env.applied, step.actions[targets])
    assert env.episode_summary()["switches"] == execute(problem.costs, env.applied, 0.0, 0.0).switches


def test_a_request_takes_effect_one_latency_later(step: StepData, problem: Problem) -> None:
    env = exact_env(problem, step)
    env.reset(seed=0)
    env.step(np.array([0, 0]))
    requested_at = env._now_s
    env.step(np.array([1, 3 * len(step.grid.memory_mhz)]))
    while env._k < step.kernels:
        env.step(np.array([0, 0]))
    start = step.cumulative[:, 0, 0]  # all auto before the change
    first = int(np.searchsorted(start[:-1], requested_at + problem.latency_s - 1e-12))
    assert np.all(env.applied[:first] == problem.costs.auto_index)
    assert env.applied[first] == step.actions[3 * len(step.grid.memory_mhz)]


def test_window_features_are_the_cost_model_over_the_window(step: StepData, problem: Problem) -> None:
    spec = ObservationSpec(step.grid, 2, (1.0, 2.0, 4.0))
    static = static_observations(step, spec, problem.latency_s)
    start = spec.offsets()["window_slowdown_then_saving_pct"]
    size, start_s = step.grid.size, step.cumulative[:-1, 0, 0]
    for k, first in ((0, 0), (1, int(np.searchsorted(start_s, start_s[1] + problem.latency_s)))):
        end = int(np.searchsorted(start_s, start_s[first] + problem.latency_s))
        time_s, energy_j = step.time_s[first:end].sum(axis=0), step.energy_j[first:end].sum(axis=0)
        savings = start + 4 * size
        assert static[k, start:start + size] == pytest.approx(100 * (time_s / time_s[0] - 1), abs=1e-3)
        assert static[k, savings:savings + size] == pytest.approx(100 * (1 - energy_j / energy_j[0]), abs=1e-3)
    rest = start + 3 * size
    time_s = step.time_s.sum(axis=0)
    assert static[0, rest:rest + size] == pytest.approx(100 * (time_s / time_s[0] - 1), abs=1e-3)


def test_spec_hash_follows_the_layout(step: StepData) -> None:
    spec = ObservationSpec(step.grid, 2, (1.0, 2.0, 4.0))
    assert spec.hash() == ObservationSpec(step.grid, 2, (1.0, 2.0, 4.0)).hash()
    assert spec.hash() != ObservationSpec(step.grid, 3, (1.0, 2.0, 4.0)).hash()
    other = ClockGrid.for_profile(load_profile("h200"), (1.0, 0.9))
    assert spec.hash() != ObservationSpec(other, 2, (1.0, 2.0, 4.0)).hash()


def test_bad_arguments_are_clear_errors(step: StepData, problem: Problem) -> None:
    other = StepData.from_costs("x", problem.trace, problem.costs, ClockGrid.for_profile(problem.profile, (1.0,)))
    with pytest.raises(KdvfsError, match="same clock grid"):
        KernelDVFSEnv([step, other], problem.profile, **FINE_GRID)  # type: ignore[arg-type]
    with pytest.raises(KdvfsError, match="budgets"):
        KernelDVFSEnv([step], problem.profile, budgets=(), **FINE_GRID)  # type: ignore[arg-type]
    env = KernelDVFSEnv([step], problem.profile, **FINE_GRID)  # type: ignore[arg-type]
    with pytest.raises(KdvfsError, match="no step named"):
        env.reset(options={"step": "missing"})
