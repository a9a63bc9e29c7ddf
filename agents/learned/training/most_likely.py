"""The shipped policy's own violations: episodes of the policy as it will be frozen (its most likely action, on
the same normalised observations) in every budget x latency cell of the training environment.

PPO's rollouts sample their actions; the policy that ships takes the most likely one, and the two can break a
cell's budget at different rates. :class:`MostLikelyEpisodes` runs a fixed number of episodes per cell of the
most likely policy on environments of its own (the training pairs, the training environment's settings), so that
the cell multipliers (:mod:`kdvfs.agents.learned.training.lagrange`) can be moved by the violation rate of the
policy that ships. Each run's episodes are seeded from the config's seed and the run's count: a run is
reproducible, and no two runs repeat their cases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError

Act = Callable[[Array], Array]
"""A batch of raw observations (episodes, observation) to one action each (the policy's most likely)."""


class MostLikelyEpisodes:
    """``per_cell`` episodes in each cell of ``budgets`` x ``latency_scales``, spread over ``envs`` (environments
    that report ``info["violation"]``, 0/1, at an episode's end and take ``budget`` and ``latency_scale`` as reset
    options: :class:`~kdvfs.envs.env.residual_env.ResidualDVFSEnv`), seeded from ``seed`` (module docstring)."""

    def __init__(self, envs: Sequence[gym.Env], budgets: Sequence[float], latency_scales: Sequence[float],
                 per_cell: int, seed: int) -> None:
        if not envs or per_cell < 1:
            raise KdvfsError("most likely episodes: need at least one environment and one episode per cell")
        self.envs, self.seed, self.runs = list(envs), seed, 0
        self.cells = [(float(b), float(s)) for b in budgets for s in latency_scales for _ in range(per_cell)]

    def run(self, act: Act) -> tuple[Array, Array, Array]:
        """One episode of ``act`` per case: the cases' budgets, latency scales and violations (0/1), each
        (cells x ``per_cell``,) in cell order. The environments step together, ``act`` called once per step on
        the episodes still running; an environment whose episode ends starts the next case."""
        seeds = np.random.default_rng([self.seed, self.runs]).integers(2**31 - 1, size=len(self.cells))
        self.runs += 1
        pending = list(range(len(self.cells)))[::-1]
        running: dict[int, tuple[int, Array]] = {}  # environment -> (case, its last observation)
        violations = np.zeros(len(self.cells))

        def start(e: int) -> None:
            case = pending.pop()
            budget, scale = self.cells[case]
            observation, _ = self.envs[e].reset(seed=int(seeds[case]),
                                                options={"budget": budget, "latency_scale": scale})
            running[e] = (case, observation)

        for e in range(min(len(self.envs), len(pending))):
            start(e)
        while running:
            order = list(running)
            actions = act(np.stack([running[e][1] for e in order]))
            for e, action in zip(order, actions, strict=True):
                case = running[e][0]
                observation, _, done, _, info = self.envs[e].step(action)
                running[e] = (case, observation)
                if done:
                    violations[case] = float(info["violation"])
                    del running[e]
                    if pending:
                        start(e)
        budgets, scales = np.array(self.cells).T
        return budgets, scales, violations
