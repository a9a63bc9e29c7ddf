"""reward_fn: its terms, the telescoping return, and the environment's rewards being its values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kdvfs.agents.learned.policy.policy_planner import rollout
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.reward import Reference, Totals, overrun_pct, reward_fn


def test_terms_add_up_and_the_return_telescopes() -> None:
    rng = np.random.default_rng(0)
    config, reference = EnvConfig(overrun_penalty=10.0), Reference(50.0, 0.04, 0.01)
    steps = np.cumsum(rng.uniform(0.0, 1.0, (40, 4)) * [1.0, 1.1, 1e-3, 1e-3], axis=0)
    path = [Totals(0.0, 0.0, 0.0, 0.0), *(Totals(*map(float, row)) for row in steps)]
    total = 0.0
    for before, after in itertools.pairwise(path):
        reward, info = reward_fn(before, after, reference, config)
        assert set(info) == {"reward_energy", "reward_time", "reward_violation"}
        assert reward == info["reward_energy"] + info["reward_time"] and info["reward_violation"] == 0.0
        total += reward
    whole, _ = reward_fn(path[0], path[-1], reference, config)
    assert total == pytest.approx(whole, abs=1e-9)
    last = path[-1]
    expected = 100 * (last.auto_energy_j - last.energy_j) / 50.0 - 10.0 * overrun_pct(last, reference)
    assert whole == pytest.approx(expected, abs=1e-9)


def test_an_episode_ending_over_budget_loses_the_violation_penalty_once() -> None:
    config, reference = EnvConfig(overrun_penalty=10.0, violation_penalty=5.0), Reference(1.0, 1.0, 0.01)
    start, over, within = Totals(0.0, 0.0, 0.0, 0.0), Totals(0.9, 1.0, 1.02, 1.0), Totals(0.9, 1.0, 1.005, 1.0)
    reward, info = reward_fn(start, over, reference, config, final=True)
    assert info["reward_violation"] == -5.0 and info["reward_time"] == pytest.approx(-10.0)
    assert reward == pytest.approx(10.0 - 10.0 - 5.0)
    assert reward_fn(start, over, reference, config)[1]["reward_violation"] == 0.0  # not the episode's end
    assert reward_fn(start, within, reference, config, final=True)[1]["reward_violation"] == 0.0


def test_overrun_counts_only_time_beyond_the_whole_steps_budget() -> None:
    reference = Reference(1.0, 1.0, 0.01)
    assert overrun_pct(Totals(0.0, 0.0, 0.5, 0.495), reference) == 0.0
    assert overrun_pct(Totals(0.0, 0.0, 0.52, 0.5), reference) == pytest.approx(1.0)


class Random:
    """Random actions (requests 30% of the time), seeded."""

    def __init__(self, env: KernelDVFSEnv) -> None:
        self.env, self.rng = env, np.random.default_rng(1)

    def act(self, _observation: np.ndarray) -> np.ndarray:
        return np.array([self.rng.random() < 0.3, self.rng.integers(self.env.action_space.nvec[1])])


def test_the_envs_rewards_are_its_info_terms_and_the_rollout_return_their_sum() -> None:
    env = KernelDVFSEnv(plan_budgets=(0.005, 0.01))
    env.reset(seed=2)
    done, total = False, 0.0
    actor = Random(env)
    observation = np.zeros(env.observation_space.shape, np.float32)
    while not done:
        observation, reward, done, _, info = env.step(actor.act(observation))
        assert reward == info["reward_energy"] + info["reward_time"] + info["reward_violation"]
        total += reward
    assert rollout(Random(env), env, seed=2)["return"] == pytest.approx(total, abs=1e-12)
