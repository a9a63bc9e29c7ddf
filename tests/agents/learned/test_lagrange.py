"""The budget multipliers of constrained PPO move the right way and price the violations."""

from __future__ import annotations

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from kdvfs.agents.learned.training.lagrange import BudgetMultipliers, ConstraintArgs, LagrangianReward
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.residual_env import ResidualDVFSEnv


def test_dual_ascent_raises_a_broken_budgets_multiplier_and_lowers_a_kept_ones_to_zero() -> None:
    multipliers = BudgetMultipliers((0.005, 0.01), ConstraintArgs(target=0.05, learning_rate=2.0, initial=1.0))
    for _ in range(12):  # toy: the 0.5% budget broken in 30% of episodes, the 1% budget never
        multipliers.update(np.array([0.005] * 10 + [0.01] * 10), np.array([1.0] * 3 + [0.0] * 17))
    assert multipliers.values[0] == pytest.approx(1.0 + 12 * 2.0 * (0.3 - 0.05))
    assert multipliers.values[1] == 0.0  # 1.0 - 12 x 2.0 x 0.05 < 0: held at 0


def test_a_multiplier_stops_at_its_cap_and_the_budget_is_reported_infeasible() -> None:
    multipliers = BudgetMultipliers((0.005, 0.01), ConstraintArgs(learning_rate=10.0, initial=1.0, cap=4.0))
    for _ in range(5):
        multipliers.update(np.array([0.005, 0.01]), np.array([1.0, 0.0]))
    assert multipliers.values[0] == 4.0 and multipliers.capped() == [0.005]


def test_a_budget_without_episodes_keeps_its_multiplier() -> None:
    multipliers = BudgetMultipliers((0.005, 0.01), ConstraintArgs(initial=0.7))
    multipliers.update(np.array([0.01]), np.array([1.0]))
    assert multipliers.values[0] == 0.7 and multipliers.values[1] > 0.7


def test_the_wrapper_takes_the_multiplier_off_an_episode_over_budget() -> None:
    config = EnvConfig(plan_budgets=(0.0, 0.01), budgets=(0.0,), residual_actions=True, latency_scales=(1.0,))
    multipliers = BudgetMultipliers((0.0,), ConstraintArgs(initial=3.0))
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
    assert wrapped.finished == [(0.0, 1.0)]
