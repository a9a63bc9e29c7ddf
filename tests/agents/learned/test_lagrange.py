"""The cell multipliers of constrained PPO move the right way, cell by cell, and price the violations."""

from __future__ import annotations

import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from kdvfs.agents.learned.training.lagrange import RECENT_ROLLOUTS, CellMultipliers, ConstraintArgs, LagrangianReward
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


def test_a_cell_still_over_its_target_in_the_last_rollouts_is_reported_unheld_below_the_cap() -> None:
    multipliers = CellMultipliers((0.005, 0.01), (0.0, 1.0), ConstraintArgs(target=0.03, learning_rate=1.0))
    budgets, scales = np.array([0.005] * 10 + [0.01] * 10), np.array([0.0, 1.0] * 10)
    once, held = np.zeros(20), np.zeros(20)
    once[[0, 1, 10, 11]] = 1.0  # every cell broken in one of its five episodes: 20% against 3%
    held[[1, 10, 11]] = 1.0  # then 0.5% at 0x never again, the others as before
    for _ in range(RECENT_ROLLOUTS):
        multipliers.update(budgets, scales, once)
    assert multipliers.unheld() == ["0.005/0.0", "0.005/1.0", "0.01/0.0", "0.01/1.0"] and multipliers.capped() == []
    for _ in range(RECENT_ROLLOUTS - 1):
        multipliers.update(budgets, scales, held)
    assert multipliers.unheld() == ["0.005/1.0", "0.01/0.0", "0.01/1.0"]  # 1 in 50 left in its window: 2%
    assert multipliers.recent_rates()[0, 0] == pytest.approx(1 / 50)


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
