"""Test doubles for ``KernelDVFS-v0``: an env whose action names a grid pair directly (to drive its execution),
the settings its defaults had before they became the shipped policies' (golden episodes use them), and the
observation at any state (:func:`observe_state`)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from kdvfs.common.arrays import Array
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.envs.env.observing.live_tables import observe_at

FINE_CORE_FRACTIONS = (1.0, 0.9925, 0.985, 0.9775, 0.97, 0.9625, 0.955, 0.9475, 0.94, 0.9325, 0.925, 0.9175, 0.91,
                       0.9025, 0.895, 0.8875, 0.88, 0.85, 0.8, 0.75, 0.7, 0.675, 0.65, 0.625, 0.6)
"""A 25-level core grid: fine steps near the maximum, coarser below."""
FINE_GRID = {"core_fractions": FINE_CORE_FRACTIONS, "every_core_clock": False}
PREVIOUS = EnvConfig(budgets=(0.01,), latency_scales=(1.0,), drift=False, step_jitter=False, overrun_penalty=20.0,
                     violation_penalty=0.0, decision_latencies=0.25, decision_fraction=0.0, **FINE_GRID)
"""``EnvConfig``'s defaults before they became the shipped policies' (with ``plan_budgets`` still the new
default: the plans are observed, the pair env's actions do not follow them)."""


class PairEnv(KernelDVFSEnv):
    """``KernelDVFS-v0`` whose action is (request?, clocks), clocks ``g < G`` a grid pair and ``G + a`` advisor
    a's proposal (the action design the environment had before only plans were actions; golden episodes were
    recorded with it): drives the environment's execution (requests, latency, stalls, disturbances,
    accounting) with chosen clocks. The observation is the environment's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.action_space = spaces.MultiDiscrete([2, self.grid.size + self.observation_spec.advisors])

    def target_pair(self, action: Array) -> int:
        choice = int(np.asarray(action)[1])
        return choice if choice < self.grid.size else int(self.advice[choice - self.grid.size])


def observe_state(env: KernelDVFSEnv, state: LiveState) -> Array:
    """The whole observation :func:`~kdvfs.envs.env.observing.live_tables.observe_at` gives at ``state`` on ``env``'s
    step, regime and budget (its last reset's), as a controller standing there observes it; the advisors'
    pairs are left in ``env.advice``."""
    tables = env.live_tables()
    arrays = tables.arrays()
    k = observe_at(*arrays[:12], tables.sizes, tables.auto_time_s, tables.latency_s, tables.stall_s, env.budget,
                   env.budget_plan, *state)
    return np.concatenate([tables.static_rows[k], tables.obs[env.observation_spec.static_size:]])
