"""Constrained PPO: a Lagrange multiplier per budget holds the share of episodes over budget at a target.

The environment reports, at each episode's end, its budget and whether it ended over it
(``info["budget"]``, ``info["violation"]``: :class:`~kdvfs.envs.env.residual_env.ResidualDVFSEnv`).
:class:`LagrangianReward` (a vectorised-env wrapper) subtracts ``lambda_b`` times that indicator from the
episode's last reward, so PPO maximises saving - lambda_b x P(violation); :class:`MultiplierCallback` moves each
multiplier by dual ascent after every rollout,

    lambda_b <- min(cap, max(0, lambda_b + learning_rate x (violation rate_b - target))),

over the rollout's finished episodes of budget b: up while the budget is broken more often than the target,
down (to 0) while less. The agent learns what margin the constraint needs instead of a hand-set penalty. A
budget whose constraint no action meets (its episodes over budget at any margin) would drive its multiplier up
without end and drown the saving in every other budget's gradient; it stops at ``cap`` and is reported as
infeasible (:meth:`BudgetMultipliers.capped`), not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError


@dataclass(frozen=True)
class ConstraintArgs:
    """The budget constraint of PPO's objective.

    Attributes:
        target: the share of episodes allowed over budget (0.05: the promise is within budget >= 95%).
        learning_rate: dual ascent step on each multiplier per rollout (reward per unit of violation rate).
        initial: each multiplier's starting value (reward lost by an episode over budget).
        cap: the most a multiplier reaches (a budget held there is reported infeasible).
    """

    target: float = 0.05
    learning_rate: float = 5.0
    initial: float = 1.0
    cap: float = 20.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.target < 1.0 or self.learning_rate < 0 or not 0 <= self.initial <= self.cap:
            raise KdvfsError("constraint: need 0 <= target < 1, learning_rate >= 0 and 0 <= initial <= cap")


class BudgetMultipliers:
    """One Lagrange multiplier per budget, moved by dual ascent (module docstring)."""

    def __init__(self, budgets: tuple[float, ...], args: ConstraintArgs) -> None:
        self.budgets, self.args = tuple(budgets), args
        self.values = np.full(len(self.budgets), args.initial)

    def index(self, budget: float) -> int:
        """The multiplier of ``budget`` (the nearest of the budgets)."""
        return int(np.argmin(np.abs(np.asarray(self.budgets) - budget)))

    def update(self, budgets: Array, violations: Array) -> Array:
        """One ascent step from finished episodes' ``budgets`` and ``violations`` (0/1); budgets without an
        episode keep their multiplier. Returns the multipliers."""
        budgets, violations = np.asarray(budgets, dtype=float), np.asarray(violations, dtype=float)
        for i, budget in enumerate(self.budgets):
            mine = np.isclose(budgets, budget)
            if mine.any():
                rate = float(violations[mine].mean())
                moved = self.values[i] + self.args.learning_rate * (rate - self.args.target)
                self.values[i] = min(self.args.cap, max(0.0, moved))
        return self.values

    def capped(self) -> list[float]:
        """The budgets whose multiplier stands at the cap: their constraint is not met by anything learned."""
        return [budget for budget, value in zip(self.budgets, self.values, strict=True) if value >= self.args.cap]


class LagrangianReward(VecEnvWrapper):
    """Subtracts the episode's budget multiplier times its violation from its last reward, and keeps the
    finished episodes' budgets and violations for :class:`MultiplierCallback`."""

    def __init__(self, venv: VecEnv, multipliers: BudgetMultipliers) -> None:
        super().__init__(venv)
        self.multipliers = multipliers
        self.finished: list[tuple[float, float]] = []

    def reset(self) -> Array:
        return self.venv.reset()  # type: ignore[return-value]

    def step_wait(self) -> tuple[Array, Array, Array, list[dict]]:
        observations, rewards, dones, infos = self.venv.step_wait()
        rewards = np.array(rewards, dtype=np.float32)
        for i, (done, info) in enumerate(zip(dones, infos, strict=True)):
            if done and "violation" in info:
                budget, violation = float(info["budget"]), float(info["violation"])
                rewards[i] -= self.multipliers.values[self.multipliers.index(budget)] * violation
                self.finished.append((budget, violation))
        return observations, rewards, dones, infos  # type: ignore[return-value]


class MultiplierCallback(BaseCallback):
    """After each rollout, a dual ascent step on the wrapper's multipliers (logged as ``constraint/*``)."""

    def __init__(self, wrapper: LagrangianReward) -> None:
        super().__init__()
        self.wrapper = wrapper

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        finished = self.wrapper.finished
        if not finished:
            return
        budgets, violations = np.array(finished).T
        values = self.wrapper.multipliers.update(budgets, violations)
        self.logger.record("constraint/violation_rate", float(violations.mean()))
        self.logger.record("constraint/multiplier_mean", float(values.mean()))
        self.logger.record("constraint/multiplier_max", float(values.max()))
        self.wrapper.finished = []
