"""The residual clone's expert: the fitting plan, or the fitting plan at each cell's best fixed margin."""

from __future__ import annotations

import numpy as np
import pytest

from kdvfs.agents.learned.training.imitation import Demonstration, ImitationArgs, expert_action, record
from kdvfs.agents.learned.training.margin_plans import CELL_BUDGETS, CELL_LATENCY_SCALES, cell_margin
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.residual_env import ResidualDVFSEnv

MARGINS = np.arange(9).reshape(3, 3)
"""A margin action per cell, each a different one (budgets 0.5/1/2% by rows, latency 0x/1x/2x by columns)."""


def test_a_budget_or_latency_between_the_cells_takes_the_nearest_cells_margin() -> None:
    assert [cell_margin(MARGINS, b, s) for b in CELL_BUDGETS for s in CELL_LATENCY_SCALES] == list(range(9))
    assert cell_margin(MARGINS, 0.0, 0.0) == 0 and cell_margin(MARGINS, 0.05, 2.0) == 8
    assert cell_margin(MARGINS, 0.013, 0.4) == 3  # 1% and 0x are nearer than 2% and 1x


def test_with_margins_the_expert_holds_its_cells_margin_and_without_them_takes_the_zero_action() -> None:
    config = EnvConfig(residual_actions=True, budgets=CELL_BUDGETS, latency_scales=CELL_LATENCY_SCALES)
    env = ResidualDVFSEnv(gpu="h200", config=config)
    env.reset(seed=0, options={"step": 0, "budget": 0.02, "latency_scale": 1.0})
    assert expert_action(env, margins=MARGINS).tolist() == [0, 0, 7]
    assert expert_action(env).tolist() == [0, 0, 0]


def test_recorded_demonstrations_take_each_cells_margin_all_episode() -> None:
    config = EnvConfig(residual_actions=True, budgets=CELL_BUDGETS, latency_scales=CELL_LATENCY_SCALES)
    env = ResidualDVFSEnv(gpu="h200", config=config)
    demos = [Demonstration(0, 0.005, 0.0), Demonstration(0, 0.01, 2.0)]
    _, actions, _ = record(env, demos, 1, 0.99, 0, margins=MARGINS)
    assert set(actions[:, 2].tolist()) == {0, 5} and (actions[:, :2] == 0).all()
    first = actions[:, 2] == 0
    assert first.argmin() == first.sum()  # the first demonstration's decisions, then the second's


def test_an_unknown_residual_expert_is_refused_by_name() -> None:
    with pytest.raises(KdvfsError, match="residual_expert 'margin'"):
        ImitationArgs(1, 1, 8, 1e-3, residual_expert="margin")
