"""What a controller runs online for a frozen policy (:class:`OnlineDecider`), and which one a policy gets
(:func:`online_decider`): a v5 policy's :class:`~kdvfs.agents.learned.policy.online.OnlinePolicy`, a residual
policy's :class:`~kdvfs.agents.learned.policy.residual_online.ResidualOnlinePolicy`."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.policy.online import OnlineDecision, OnlinePolicy
from kdvfs.agents.learned.policy.residual_online import ResidualOnlinePolicy
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.live import LiveState


class OnlineDecider(Protocol):
    """A frozen policy deciding online over one expected step (times on the model timeline, s): the interface
    :class:`~kdvfs.agents.learned.policy.online.OnlinePolicy` documents, which the controller calls."""

    policy: FrozenPolicy
    labels: tuple[str, ...]
    cumulative_s: np.ndarray
    auto_time_s: float
    decision_interval_s: float
    latency_std_s: float

    @property
    def env(self) -> KernelDVFSEnv:
        """The policy's environment of the step (its ``stall_s``, tables)."""

    @property
    def elapsed_factors(self) -> np.ndarray | None:
        """(G,) factors on each pair's predicted time for the controller's ``PredictedElapsed`` (None: 1)."""

    def prepare(self) -> None: ...

    def pair_of(self, label: str) -> int: ...

    def begin(self, budget: float) -> int: ...

    def decide(self, state: LiveState, now_s: float) -> OnlineDecision: ...

    def warm(self, state: LiveState) -> None: ...

    def first_change(self, kernels: np.ndarray, in_effect: int, elapsed_s: np.ndarray, auto_elapsed_s: np.ndarray,
                     last_latency_ratio: float, drift_pct: float, model_elapsed_s: np.ndarray) -> int: ...


def online_decider(policy: FrozenPolicy, problem: Problem, env: KernelDVFSEnv | None = None) -> OnlineDecider:
    """``policy`` deciding online over ``problem``'s step (``env``: its ``policy_env``, when already built)."""
    if policy.config.residual_actions:
        return ResidualOnlinePolicy(policy, problem, env)
    return OnlinePolicy(policy, problem, env)

