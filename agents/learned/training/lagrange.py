"""Constrained PPO: a Lagrange multiplier per budget x switching-latency cell holds the share of episodes over
budget at a target in each cell.

The environment reports, at each episode's end, its budget, its latency scale and whether it ended over budget
(``info["budget"]``, ``info["latency_scale"]``, ``info["violation"]``:
:class:`~kdvfs.envs.env.residual_env.ResidualDVFSEnv`). :class:`LagrangianReward` (a vectorised-env wrapper)
subtracts ``lambda_c`` times that indicator from the episode's last reward, so PPO maximises saving -
lambda_c x P(violation) in every cell c; :class:`MultiplierCallback` moves each multiplier by dual ascent after
every rollout, lambda_c <- min(cap, max(0, lambda_c + learning_rate x (violation rate_c - target))), over the
rollout's finished episodes of cell c, or with ``ConstraintArgs.most_likely_episodes`` over episodes of the most
likely policy, the one that ships (:mod:`kdvfs.agents.learned.training.most_likely`): up while the cell's budget is
broken more often than the target, down (to 0) while less. One multiplier per budget would let a cell that keeps
its budget easily hide one that does not. A cell whose constraint no action meets would drive its multiplier up
without end and drown the saving in every other cell's gradient; it stops at ``cap`` and is reported as infeasible
(:meth:`CellMultipliers.capped`), not hidden. A cell whose episodes (those that move its multiplier) still break
its budget more often than the target over its last ``RECENT_EPISODES`` episodes is reported too
(:meth:`CellMultipliers.unheld`): the constraint was not met by the end of training, whatever its multiplier.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper, VecNormalize

from kdvfs.agents.learned.training.most_likely import MostLikelyEpisodes
from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError

RECENT_EPISODES = 60
"""A cell's last episodes (those that move its multiplier) over which its violation rate at the end of training is
measured (:meth:`CellMultipliers.unheld`): counted in episodes, not rollouts, as a rollout has a handful of a cell's
sampled episodes but only ``most_likely_episodes`` of its most likely ones, and a rate over a few episodes says
little (the validation selection scores as many a cell)."""


@dataclass(frozen=True)
class ConstraintArgs:
    """The budget constraint of PPO's objective.

    Attributes:
        target: the share of episodes allowed over budget (0.05: the promise is within budget >= 95%).
        learning_rate: dual ascent step on each multiplier per rollout (reward per unit of violation rate).
        initial: each multiplier's starting value (reward lost by an episode over budget).
        cap: the most a multiplier reaches (a budget held there is reported infeasible).
        most_likely_episodes: episodes per cell of the most likely policy (the one that ships) run on the training
            pairs after every rollout, whose violation rates move the multipliers instead of the rollout's; 0:
            none, the rollout's sampled episodes move them.
    """

    target: float = 0.05
    learning_rate: float = 5.0
    initial: float = 1.0
    cap: float = 20.0
    most_likely_episodes: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.target < 1.0 or self.learning_rate < 0 or not 0 <= self.initial <= self.cap:
            raise KdvfsError("constraint: need 0 <= target < 1, learning_rate >= 0 and 0 <= initial <= cap")
        if self.most_likely_episodes < 0:
            raise KdvfsError(f"constraint: most_likely_episodes must be >= 0, got {self.most_likely_episodes}")


class CellMultipliers:
    """One Lagrange multiplier per budget x latency-scale cell, moved by dual ascent (module docstring)."""

    def __init__(self, budgets: tuple[float, ...], latency_scales: tuple[float, ...], args: ConstraintArgs) -> None:
        self.budgets, self.latency_scales, self.args = tuple(budgets), tuple(latency_scales), args
        self.values = np.full((len(self.budgets), len(self.latency_scales)), args.initial)
        self._recent = [[deque[float](maxlen=RECENT_EPISODES) for _ in self.latency_scales] for _ in self.budgets]

    def index(self, budget: float, latency_scale: float) -> tuple[int, int]:
        """The multiplier of the cell of ``budget`` and ``latency_scale`` (the nearest of each)."""
        return (int(np.argmin(np.abs(np.asarray(self.budgets) - budget))),
                int(np.argmin(np.abs(np.asarray(self.latency_scales) - latency_scale))))

    def update(self, budgets: Array, latency_scales: Array, violations: Array) -> Array:
        """One ascent step from finished episodes' ``budgets``, ``latency_scales`` and ``violations`` (0/1);
        cells without an episode keep their multiplier. Returns the multipliers (budgets, latency scales)."""
        cells = [self.index(float(b), float(s)) for b, s in zip(budgets, latency_scales, strict=True)]
        violations = np.asarray(violations, dtype=float)
        episodes, broken = np.zeros(self.values.shape), np.zeros(self.values.shape)
        for cell, violation in zip(cells, violations, strict=True):
            episodes[cell] += 1
            broken[cell] += violation
            self._recent[cell[0]][cell[1]].append(float(violation))
        for cell in set(cells):
            moved = self.values[cell] + self.args.learning_rate * (broken[cell] / episodes[cell] - self.args.target)
            self.values[cell] = min(self.args.cap, max(0.0, moved))
        return self.values

    def recent_rates(self) -> Array:
        """(budgets, latency scales) each cell's share of episodes over budget over its last ``RECENT_EPISODES``
        episodes (NaN where it had none)."""
        return np.array([[float(np.mean(cell)) if cell else np.nan for cell in row] for row in self._recent])

    def by_cell(self) -> dict[str, float]:
        """Each multiplier by its cell's name (``budget/latency scale``, e.g. ``0.01/2.0``)."""
        return {f"{budget}/{scale}": float(self.values[b, s]) for b, budget in enumerate(self.budgets)
                for s, scale in enumerate(self.latency_scales)}

    def capped(self) -> list[str]:
        """The cells (named as :meth:`by_cell`) whose multiplier stands at the cap: their constraint is not met
        by anything learned."""
        return [name for name, value in self.by_cell().items() if value >= self.args.cap]

    def unheld(self) -> list[str]:
        """The cells (named as :meth:`by_cell`) whose episodes broke the budget more often than the target over
        its last ``RECENT_EPISODES`` episodes: the constraint is not held there (yet), capped or not."""
        rates = self.recent_rates()
        return [f"{budget}/{scale}" for b, budget in enumerate(self.budgets)
                for s, scale in enumerate(self.latency_scales) if rates[b, s] > self.args.target]


class LagrangianReward(VecEnvWrapper):
    """Subtracts the episode's cell multiplier times its violation from its last reward, and keeps the finished
    episodes' budgets, latency scales and violations for :class:`MultiplierCallback`."""

    def __init__(self, venv: VecEnv, multipliers: CellMultipliers) -> None:
        super().__init__(venv)
        self.multipliers = multipliers
        self.finished: list[tuple[float, float, float]] = []

    def reset(self) -> Array:
        return self.venv.reset()  # type: ignore[return-value]

    def step_wait(self) -> tuple[Array, Array, Array, list[dict]]:
        observations, rewards, dones, infos = self.venv.step_wait()
        rewards = np.array(rewards, dtype=np.float32)
        for i, (done, info) in enumerate(zip(dones, infos, strict=True)):
            if done and "violation" in info:
                budget, scale, violation = float(info["budget"]), float(info["latency_scale"]), float(info["violation"])
                rewards[i] -= self.multipliers.values[self.multipliers.index(budget, scale)] * violation
                self.finished.append((budget, scale, violation))
        return observations, rewards, dones, infos  # type: ignore[return-value]


class MultiplierCallback(BaseCallback):
    """After each rollout, a dual ascent step on the wrapper's multipliers (logged as ``constraint/*``): on the
    rollout's finished episodes, or, given ``most_likely``, on its episodes of the model's most likely actions (on
    the training env's normalised observations, as the policy is frozen: module docstring)."""

    def __init__(self, wrapper: LagrangianReward, most_likely: MostLikelyEpisodes | None = None) -> None:
        super().__init__()
        self.wrapper, self.most_likely = wrapper, most_likely

    def _on_step(self) -> bool:
        return True

    def _act(self, observations: Array) -> Array:
        """The model's most likely actions on raw ``observations``, normalised as the training env does."""
        env = self.training_env
        assert isinstance(env, VecNormalize)
        actions, _ = self.model.predict(env.normalize_obs(observations), deterministic=True)
        return actions

    def _on_rollout_end(self) -> None:
        finished, self.wrapper.finished = self.wrapper.finished, []
        if finished:
            self.logger.record("constraint/violation_rate", float(np.array(finished)[:, 2].mean()))
        if self.most_likely is not None:
            budgets, scales, violations = self.most_likely.run(self._act)
            self.logger.record("constraint/most_likely_violation_rate", float(violations.mean()))
        elif finished:
            budgets, scales, violations = np.array(finished).T
        else:
            return
        values = self.wrapper.multipliers.update(budgets, scales, violations)
        self.logger.record("constraint/multiplier_mean", float(values.mean()))
        self.logger.record("constraint/multiplier_max", float(values.max()))
