"""A frozen policy behind the planner interface, so ``compare``, ``evaluate`` and ``demo`` score it like
every other method: it is rolled deterministically through ``KernelDVFS-v0`` on the problem's step (mean
switching latency, no noise) and its schedule is the clocks that ran (``Schedule.reactive``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.evaluation.compare import Row, scored_row
from kdvfs.agents.learned.policy.frozen import FrozenPolicy, PolicyFileError
from kdvfs.common.arrays import Array
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.residual_env import ResidualDVFSEnv
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.model.schedule import Schedule


def policy_env(policy: FrozenPolicy, problem: Problem, disturbed: bool = False, one_step: bool = False
               ) -> KernelDVFSEnv:
    """The environment of ``problem`` as ``policy`` sees it (``KernelDVFSResidual-v0`` for a residual policy): its
    settings with the problem's budget and switching (the profile's spread scaled with the latency, as in the
    training regimes); one step and no disturbance, or (``disturbed``) the policy's runs with every disturbance
    on (runs of one step if ``one_step``)."""
    if problem.profile.name != policy.gpu:
        raise PolicyFileError(f"policy was trained for GPU {policy.gpu!r}, the problem is on {problem.profile.name!r}")
    step = StepData.from_costs(problem.trace.meta.workload, problem.trace, problem.costs, policy.grid(problem.profile))
    config = policy.config.with_disturbances() if disturbed else policy.config.without_disturbances().replace(
        run_steps=1)
    config = config.replace(run_steps=1) if one_step else config
    mean_s, std_s = problem.profile.switching.latency_mean_s, problem.profile.switching.latency_std_s
    spread_s = std_s * problem.latency_s / mean_s if mean_s > 0 else 0.0
    kind = ResidualDVFSEnv if config.residual_actions else KernelDVFSEnv
    return kind([step], problem.profile, config, budgets=(problem.budget,), latency_s=problem.latency_s,
                latency_scales=(1.0,), latency_std_s=spread_s, stall_s=problem.stall_s)


class Actor(Protocol):
    """Anything that picks an action for an observation (a :class:`FrozenPolicy`, an expert)."""

    def act(self, observation: Array) -> Array: ...


def rollout(policy: Actor, env: KernelDVFSEnv, options: dict[str, Any] | None = None, seed: int = 0
            ) -> dict[str, Any]:
    """One episode of ``policy`` on ``env`` (reset with ``seed`` and ``options``): the episode summary and
    its ``return`` (the sum of its rewards). The clocks that ran are left in ``env.applied``."""
    observation, _ = env.reset(seed=seed, options=options)
    done, total = False, 0.0
    while not done:
        observation, reward, done, _, _ = env.step(policy.act(observation))
        total += reward
    return {**env.episode_summary(), "return": total}


@dataclass
class PolicyPlanner:
    """Runs a :class:`FrozenPolicy` over the step; ``solve_s`` is the whole rollout's wall time."""

    policy: FrozenPolicy
    name: str = "policy"

    @classmethod
    def from_file(cls, path: Path, profile: GpuProfile, name: str = "policy") -> PolicyPlanner:
        return cls(FrozenPolicy.load(path, profile), name)

    def plan(self, problem: Problem, env: KernelDVFSEnv | None = None) -> Schedule:
        """The policy's noise-free rollout over ``problem``'s step, on ``env`` (its :func:`policy_env`, built
        here when None)."""
        start = time.perf_counter()
        env = policy_env(self.policy, problem) if env is None else env
        summary = rollout(self.policy, env)
        return Schedule(env.applied.copy(), self.name, time.perf_counter() - start,
                        {"switches": float(summary["switches"])}, reactive=True)


def policy_rows(problem: Problem, planner: PolicyPlanner, budgets: Sequence[float]) -> list[Row]:
    """The policy's ``compare`` rows at each budget (executed, and as planned)."""
    rows = []
    for budget in budgets:
        case = problem.with_budget(budget)
        rows.append(scored_row(case, planner.plan(case)))
    return rows
