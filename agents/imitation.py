"""A head start for PPO: behaviour cloning of the latency-aware optimum on the training steps.

Random clocks overrun a 1% budget by far more than any clock saves, so PPO from scratch learns to leave
the GPU on auto and stops exploring. Instead the policy first imitates an expert: the latency-aware
optimum (:mod:`agents.latency_optimal`) of each training step on the policy's clock grid, replayed through
the environment's request semantics (at each decision point, request the optimum's clocks for the kernel
where a request made now would take effect). The critic learns the expert's discounted returns. PPO then
improves on the clone with the environment's own reward (budget tracking under noise, unseen steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from stable_baselines3.common.policies import ActorCriticPolicy

from agents.latency_optimal import LatencyOptimal
from agents.problem import InfeasibleBudgetError, Problem
from envs.cost_model import Array
from envs.dvfs_env import KernelDVFSEnv
from envs.schedule import ActionCosts
from envs.step_data import StepData

EXPERT_BISECTIONS = 25
"""Bisection steps on the multiplier per expert plan (the planner's default is 40; 25 resolve it to ~3e-8)."""


@dataclass(frozen=True)
class ImitationArgs:
    """Behaviour cloning before PPO.

    Attributes:
        episodes_per_step: expert episodes recorded per demonstration (with the env's noise).
        epochs: passes over the recorded decisions.
        batch_size: decisions per gradient step.
        learning_rate: Adam step size.
        budget_margin: the expert plans for ``budget * (1 - budget_margin)``, leaving room for noise.
    """

    episodes_per_step: int
    epochs: int
    batch_size: int
    learning_rate: float
    budget_margin: float


def grid_costs(step: StepData) -> ActionCosts:
    """The step's grid actions as planner costs (grid action 0, auto, is the default behaviour)."""
    labels = [step.grid.label(g).split(":") for g in range(step.grid.size)]
    core = np.array([np.nan if c == "auto" else float(c) for c, _ in labels])
    return ActionCosts(step.time_s, step.energy_j, core, np.array([float(m) for _, m in labels]), 0,
                       step.idle_power_w)


def expert_schedule(step: StepData, budget: float, latency_s: float, stall_s: float) -> Array:
    """(K,) grid actions of the latency-aware optimum of ``step`` (all auto where no plan fits the budget)."""
    problem = Problem(None, None, grid_costs(step), budget, latency_s, stall_s)  # type: ignore[arg-type]
    try:
        return LatencyOptimal(iterations=EXPERT_BISECTIONS).plan(problem).actions
    except InfeasibleBudgetError:
        return np.zeros(step.kernels, dtype=np.int64)


@dataclass(frozen=True)
class Demonstration:
    """The expert's schedule of step ``index`` of the environment at ``budget``."""

    index: int
    budget: float
    schedule: Array


def demonstrations(env: KernelDVFSEnv, budgets: Sequence[float], margin: float, seed: int,
                   workers: int) -> list[Demonstration]:
    """The expert on every step of ``env`` at the first budget and at one other drawn from ``budgets``,
    each planned for ``budget * (1 - margin)``; solved in ``workers`` processes."""
    rng = np.random.default_rng(seed)
    cases = [(i, b) for i in range(len(env.steps))
             for b in dict.fromkeys((budgets[0], budgets[int(rng.integers(len(budgets)))]))]
    args = [(env.steps[i], b * (1.0 - margin), env.latency_s, env.stall_s) for i, b in cases]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        schedules = list(pool.map(expert_schedule, *zip(*args, strict=True)))
    return [Demonstration(i, b, s) for (i, b), s in zip(cases, schedules, strict=True)]


def expert_action(env: KernelDVFSEnv, schedule: Array) -> Array:
    """What the expert does now: request the schedule's clocks where a request would take effect, through
    the first advisor (rest of step first, then the longest window) that proposes them, if any."""
    kernel, in_effect, pending = env.clocks
    target = int(schedule[0 if kernel == 0 else min(env.effect_kernel(), len(schedule) - 1)])
    request = pending < 0 and target != in_effect
    advisors = env.advice
    for advisor in range(len(advisors) - 1, -1, -1):
        if advisors[advisor] == target:
            return np.array([int(request), env.grid.size + advisor])
    return np.array([int(request), target])


def record(env: KernelDVFSEnv, demos: Sequence[Demonstration], episodes: int, gamma: float,
           seed: int) -> tuple[Array, Array, Array]:
    """Observations, expert actions and discounted returns of ``episodes`` episodes per demonstration."""
    observations: list[Array] = []
    actions: list[Array] = []
    returns: list[float] = []
    for demo in demos:
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed + episode, options={"step": demo.index, "budget": demo.budget})
            rewards, done = [], False
            while not done:
                action = expert_action(env, demo.schedule)
                observations.append(observation)
                actions.append(action)
                observation, reward, done, _, _ = env.step(action)
                rewards.append(reward)
            returns.extend(_discounted(np.array(rewards), gamma))
    return np.array(observations), np.array(actions), np.array(returns, dtype=np.float32)


def _discounted(rewards: Array, gamma: float) -> Array:
    out, running = np.empty_like(rewards), 0.0
    for i in range(len(rewards) - 1, -1, -1):
        running = rewards[i] + gamma * running
        out[i] = running
    return out


def clone(policy: ActorCriticPolicy, observations: Array, actions: Array, returns: Array, args: ImitationArgs,
          seed: int) -> dict[str, float]:
    """Fit an SB3 actor-critic ``policy`` to the expert: maximise the log-likelihood of its actions, regress
    values on its returns. ``observations`` must already be normalised as the policy sees them. Requests
    are rare (a few per step) and decisive, so requests and holds weigh the same in total."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate)
    obs_t, act_t = torch.as_tensor(observations, dtype=torch.float32), torch.as_tensor(actions)
    ret_t = torch.as_tensor(returns, dtype=torch.float32)
    requests = float(actions[:, 0].sum())
    weight_t = torch.where(act_t[:, 0] == 1, (len(actions) - requests) / max(requests, 1.0), 1.0).float()
    policy.train()
    for _ in range(args.epochs):
        for batch in torch.randperm(len(obs_t), generator=generator).split(args.batch_size):
            values, log_prob, _ = policy.evaluate_actions(obs_t[batch], act_t[batch])
            imitation = -(weight_t[batch] * log_prob).sum() / weight_t[batch].sum()
            loss = imitation + 0.5 * torch.nn.functional.mse_loss(values.flatten(), ret_t[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    policy.train(False)
    with torch.no_grad():
        predicted = policy._predict(obs_t, deterministic=True)
    same_request = predicted[:, 0] == act_t[:, 0]
    same_clocks = (predicted[:, 1:] == act_t[:, 1:]).all(dim=1) | (act_t[:, 0] == 0)
    agree = same_request & same_clocks
    return {"expert_agreement": float(agree.float().mean()), "decisions": len(obs_t),
            "expert_requests": int(requests), "requests_reproduced": float(agree[act_t[:, 0] == 1].float().mean())}
