"""The cell multipliers of constrained PPO move the right way, cell by cell, and price the violations."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from kdvfs.agents.learned.training.lagrange import (
    RECENT_EPISODES,
    CellMultipliers,
    ConstraintArgs,
    LagrangianReward,
    MultiplierCallback,
)
from kdvfs.agents.learned.training.most_likely import MostLikelyEpisodes
from kdvfs.agents.learned.training.ppo import PPO_CONFIG_DIR, load_train_config
from kdvfs.common.arrays import Array
from kdvfs.common.config import ConfigError
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.residual_env import ResidualDVFSEnv


def test_dual_ascent_raises_a_broken_cells_multiplier_and_lowers_a_kept_ones_to_zero() -> None:
    args = ConstraintArgs(target=0.05, learning_rate=2.0, initial=1.0)
    multipliers = CellMultipliers((0.005, 0.01), (0.0, 1.0), args)
    budgets, scales = np.array([0.005] * 10 + [0.01] * 10), np.array([0.0, 1.0] * 10)
    violations = np.array([1.0, 0.0] * 3 + [0.0] * 14)  # 0.5% at 0x broken in 3 of its 5 episodes; the rest never
    for _ in range(12):
        multipliers.update(budgets, scales, violations)
    assert multipliers.values[0, 0] == pytest.approx(1.0 + 12 * 2.0 * (0.6 - 0.05))
    assert multipliers.values[0, 1] == 0.0  # the same budget at 1x kept: held at 0, not raised with its neighbour
    assert (multipliers.values[1] == 0.0).all()


def test_a_multiplier_stops_at_its_cap_and_the_cell_is_reported_infeasible() -> None:
    multipliers = CellMultipliers((0.005, 0.01), (0.0, 1.0), ConstraintArgs(learning_rate=10.0, initial=1.0, cap=4.0))
    for _ in range(5):
        multipliers.update(np.array([0.005, 0.005, 0.01]), np.array([0.0, 1.0, 0.0]), np.array([1.0, 0.0, 0.0]))
    assert multipliers.values[0, 0] == 4.0 and multipliers.capped() == ["0.005/0.0"]
    assert set(multipliers.by_cell()) == {"0.005/0.0", "0.005/1.0", "0.01/0.0", "0.01/1.0"}


def test_a_cell_still_over_its_target_in_its_last_episodes_is_reported_unheld_below_the_cap() -> None:
    multipliers = CellMultipliers((0.005, 0.01), (0.0, 1.0), ConstraintArgs(target=0.03, learning_rate=1.0))
    budgets, scales = np.array([0.005] * 10 + [0.01] * 10), np.array([0.0, 1.0] * 10)
    once, held = np.zeros(20), np.zeros(20)
    once[[0, 1, 10, 11]] = 1.0  # every cell broken in one of its five episodes: 20% against 3%
    held[[1, 10, 11]] = 1.0  # then 0.5% at 0x never again, the others as before
    rollouts = RECENT_EPISODES // 5
    for _ in range(rollouts):
        multipliers.update(budgets, scales, once)
    assert multipliers.unheld() == ["0.005/0.0", "0.005/1.0", "0.01/0.0", "0.01/1.0"] and multipliers.capped() == []
    for _ in range(rollouts - 1):
        multipliers.update(budgets, scales, held)
    assert multipliers.unheld() == ["0.005/1.0", "0.01/0.0", "0.01/1.0"]  # one rollout's violation left in its window
    assert multipliers.recent_rates()[0, 0] == pytest.approx(1 / RECENT_EPISODES)


def test_a_cells_window_counts_its_episodes_not_the_updates() -> None:
    multipliers = CellMultipliers((0.01,), (0.0,), ConstraintArgs(target=0.03))
    multipliers.update(np.array([0.01]), np.array([0.0]), np.array([1.0]))
    for _ in range(RECENT_EPISODES - 2):  # one episode an update, as the most likely episodes give
        multipliers.update(np.array([0.01]), np.array([0.0]), np.array([0.0]))
    assert multipliers.recent_rates()[0, 0] == pytest.approx(1 / (RECENT_EPISODES - 1))  # under 3%: held
    assert multipliers.unheld() == []
    multipliers.update(np.array([0.01, 0.01]), np.array([0.0, 0.0]), np.array([0.0, 0.0]))  # the violation leaves
    assert multipliers.recent_rates()[0, 0] == 0.0


def test_a_cell_without_episodes_keeps_its_multiplier() -> None:
    multipliers = CellMultipliers((0.005, 0.01), (0.0, 1.0), ConstraintArgs(initial=0.7))
    multipliers.update(np.array([0.01]), np.array([1.0]), np.array([1.0]))
    assert multipliers.values[1, 1] > 0.7 and (multipliers.values.ravel()[:3] == 0.7).all()


def test_the_wrapper_takes_the_multiplier_off_an_episode_over_budget() -> None:
    config = EnvConfig(plan_budgets=(0.0, 0.01), budgets=(0.0,), residual_actions=True, latency_scales=(1.0,))
    multipliers = CellMultipliers((0.0,), (1.0,), ConstraintArgs(initial=3.0))
    plain = DummyVecEnv([lambda: ResidualDVFSEnv(gpu="h200", config=config)])
    wrapped = LagrangianReward(DummyVecEnv([lambda: ResidualDVFSEnv(gpu="h200", config=config)]), multipliers)
    plain.seed(1)
    wrapped.seed(1)
    plain.reset()
    wrapped.reset()
    action = np.array([[5, 1, 0]])  # four core levels and a memory clock below the plan at a 0% budget: over it
    while True:
        _, reward, done, infos = plain.step(action)
        _, lagrangian, _, _ = wrapped.step(action)
        if done[0]:
            break
    assert infos[0]["violation"] == 1.0
    assert lagrangian[0] == np.float32(reward[0] - 3.0)
    assert wrapped.finished == [(0.0, 1.0, 1.0)]


class OneDecision(gym.Env):
    """An episode of one decision whose observation is its budget: action 1 breaks the budget, 0 keeps it."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Array, dict]:
        self.seeds.append(seed)
        self.cell = (options or {}).get("budget", 0.005), (options or {}).get("latency_scale", 0.0)
        return np.array([self.cell[0]], dtype=np.float32), {}

    def step(self, action: Array) -> tuple[Array, float, bool, bool, dict]:
        info = {"budget": self.cell[0], "latency_scale": self.cell[1], "violation": float(action)}
        return np.zeros(1, dtype=np.float32), 0.0, True, False, info


class BreaksWhenNormalised:
    """A model stub whose most likely action breaks the budget when it sees normalised observations (> 1)."""

    def __init__(self, env: VecNormalize) -> None:
        self.env, self.logger = env, configure(None, [""])

    def get_env(self) -> VecNormalize:
        return self.env

    def predict(self, observations: Array, deterministic: bool = False) -> tuple[Array, None]:
        assert deterministic
        return (observations[:, 0] > 1.0).astype(np.int64), None


def _callback(args: ConstraintArgs, most_likely: MostLikelyEpisodes | None) -> tuple[MultiplierCallback, Array]:
    """A callback on (0.005, 0.01) x (0x) whose wrapper saw ten rollout episodes per cell, none over budget."""
    multipliers = CellMultipliers((0.005, 0.01), (0.0,), args)
    env = VecNormalize(DummyVecEnv([OneDecision]), norm_reward=False)
    env.obs_rms.mean, env.obs_rms.var = np.zeros(1), np.full(1, 1e-6)  # raw budgets normalise to 5 and 10
    wrapper = LagrangianReward(env, multipliers)
    callback = MultiplierCallback(wrapper, most_likely)
    callback.init_callback(BreaksWhenNormalised(env))  # type: ignore[arg-type]
    wrapper.finished = [(budget, 0.0, 0.0) for budget in (0.005, 0.01) for _ in range(10)]
    return callback, multipliers.values


def test_most_likely_violations_move_the_multipliers_when_the_sampled_ones_are_under_target() -> None:
    args = ConstraintArgs(target=0.03, learning_rate=2.0, initial=1.0, most_likely_episodes=3)
    callback, values = _callback(args, MostLikelyEpisodes([OneDecision(), OneDecision()], (0.005, 0.01), (0.0,), 3, 0))
    callback.on_rollout_end()
    assert values == pytest.approx(np.full((2, 1), 1.0 + 2.0 * (1.0 - 0.03)))  # every most likely episode broke it
    assert callback.wrapper.finished == [] and callback.wrapper.multipliers.unheld() == ["0.005/0.0", "0.01/0.0"]


def test_without_most_likely_episodes_the_rollouts_episodes_move_the_multipliers() -> None:
    callback, values = _callback(ConstraintArgs(target=0.03, learning_rate=2.0, initial=1.0), None)
    callback.on_rollout_end()
    assert values == pytest.approx(np.full((2, 1), 1.0 - 2.0 * 0.03))
    assert callback.wrapper.multipliers.unheld() == []


def test_most_likely_episodes_run_every_case_once_in_cell_order_seeded_from_the_seed_and_the_run() -> None:
    envs = [OneDecision() for _ in range(3)]
    runner = MostLikelyEpisodes(envs, (0.005, 0.01), (0.0, 2.0), 2, seed=7)
    budgets, scales, violations = runner.run(lambda observations: (observations[:, 0] > 0.006).astype(np.int64))
    assert budgets.tolist() == [0.005] * 4 + [0.01] * 4 and scales.tolist() == [0.0, 0.0, 2.0, 2.0] * 2
    assert violations.tolist() == [0.0] * 4 + [1.0] * 4
    first = sorted(s for env in envs for s in env.seeds)
    again = [OneDecision() for _ in range(2)]
    MostLikelyEpisodes(again, (0.005, 0.01), (0.0, 2.0), 2, seed=7).run(lambda o: np.zeros(len(o), dtype=np.int64))
    assert sorted(s for env in again for s in env.seeds) == first and len(set(first)) == 8
    ran = [len(env.seeds) for env in envs]
    runner.run(lambda o: np.zeros(len(o), dtype=np.int64))
    assert not {s for env, n in zip(envs, ran, strict=True) for s in env.seeds[n:]} & set(first)  # new cases


@pytest.mark.parametrize("episodes", [-1, 1.5, True])
def test_most_likely_episodes_must_be_a_whole_number_of_at_least_zero(tmp_path: Path, episodes: object) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"extends": str(PPO_CONFIG_DIR / "residual-a100-sxm4.yaml"),
                                    "constraint": {"most_likely_episodes": episodes}}))
    with pytest.raises((ConfigError, KdvfsError), match="most_likely_episodes"):
        load_train_config(path)


@pytest.mark.parametrize("config", ["residual-b200"])
def test_configs_that_do_not_name_most_likely_episodes_keep_the_rollouts_rates(config: str) -> None:
    constraint = load_train_config(config).constraint
    assert constraint is not None and constraint.most_likely_episodes == 0
