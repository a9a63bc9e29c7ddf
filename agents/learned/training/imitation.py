"""A head start for PPO: behaviour cloning of a plan advisor on the training steps.

Random clocks overrun a 1% budget by far more than any clock saves, so PPO from scratch learns to leave
the GPU on auto and stops exploring. Instead the policy first imitates an expert: at each decision point,
request the pair of one plan advisor (:mod:`kdvfs.envs.env.advice.plan_advice`: the latency-aware optimum of the
step on the policy's clock grid for each budget), through the environment's own request semantics:
``budget_plan``, the plan with the largest budget within the episode's (open loop: the same plan whatever
happens), or ``fitting_plan``, the plan saving the most among those whose slowdown fits what the run can
still afford as measured (closed loop, but with no margin for what the disturbances do next). The critic
learns the expert's discounted returns. PPO then improves on the clone with the environment's own reward
(budget tracking under noise, unseen steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from stable_baselines3.common.policies import ActorCriticPolicy

from kdvfs.common.arrays import Array
from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv

EXPERTS = ("budget_plan", "fitting_plan")
"""The advisors an expert may follow (groups of :data:`kdvfs.envs.env.observing.observation.ADVISOR_GROUPS`)."""


@dataclass(frozen=True)
class ImitationArgs:
    """Behaviour cloning before PPO.

    Attributes:
        episodes_per_step: expert episodes recorded per demonstration (with the env's noise).
        epochs: passes over the recorded decisions.
        batch_size: decisions per gradient step.
        learning_rate: Adam step size.
        expert: the plan advisor imitated, one of ``EXPERTS``.
        entropy_coef: weight of the policy's entropy, subtracted from the cloning loss, so that the clone keeps
            some probability on other choices for PPO to explore from (a clone sure of every decision gives PPO
            nothing to compare); the deterministic clone still takes the expert's action.
        anchor_coef: weight of the clone's anchor during PPO
            (:class:`kdvfs.agents.learned.training.anchored.AnchoredPPO`: after each PPO update, gradient steps
            on this times the negative log-likelihood of the expert's actions on the demonstrations); 0: PPO is
            only initialised from the clone.
        anchor_batches: anchor gradient steps (of ``batch_size`` decisions) after each PPO update.
    """

    episodes_per_step: int
    epochs: int
    batch_size: int
    learning_rate: float
    expert: str = "budget_plan"
    entropy_coef: float = 0.0
    anchor_coef: float = 0.0
    anchor_batches: int = 4

    def __post_init__(self) -> None:
        if self.expert not in EXPERTS:
            raise KdvfsError(f"imitation expert {self.expert!r} is not one of {list(EXPERTS)}")
        if self.anchor_coef < 0 or self.anchor_batches < 1:
            raise KdvfsError("imitation anchor_coef must be >= 0 and anchor_batches >= 1")


@dataclass(frozen=True)
class Demonstration:
    """Expert episodes on step ``index`` of the environment at ``budget`` and switching latency scale
    ``latency_scale``."""

    index: int
    budget: float
    latency_scale: float


def demonstrations(env: KernelDVFSEnv) -> list[Demonstration]:
    """Every step of ``env`` at every budget and latency scale it draws from: the clone is shown every case
    the policy serves."""
    return [Demonstration(i, b, scale) for i in range(len(env.steps)) for b in env.config.budgets
            for scale in env.config.latency_scales]


def expert_action(env: KernelDVFSEnv, expert: str = "budget_plan") -> Array:
    """What the expert does at every decision: request the pair advisor ``expert`` (one of ``EXPERTS``)
    proposes. A standing order: the environment ignores it while a request is pending or when that pair is
    in effect, so the expert's action is the same all episode and the plan's changes happen when the
    advisor proposes them. With residual actions (``KernelDVFSResidual-v0``) the expert is the fitting plan: the zero
    action."""
    if env.config.residual_actions:
        return np.zeros(len(env.action_space.nvec), dtype=np.int64)  # type: ignore[attr-defined]
    return np.array([1, env.advisor_action(expert)])


@dataclass(frozen=True)
class Expert:
    """The expert following advisor ``expert`` as an actor on ``env`` (for rollouts next to frozen policies)."""

    env: KernelDVFSEnv
    expert: str = "budget_plan"

    def act(self, _observation: Array) -> Array:
        return expert_action(self.env, self.expert)


def record(env: KernelDVFSEnv, demos: Sequence[Demonstration], episodes: int, gamma: float,
           seed: int, expert: str = "budget_plan") -> tuple[Array, Array, Array]:
    """Observations, expert actions and discounted returns of ``episodes`` episodes per demonstration."""
    observations: list[Array] = []
    actions: list[Array] = []
    returns: list[float] = []
    for demo in demos:
        for episode in range(episodes):
            options = {"step": demo.index, "budget": demo.budget, "latency_scale": demo.latency_scale}
            observation, _ = env.reset(seed=seed + episode, options=options)
            rewards, done = [], False
            while not done:
                action = expert_action(env, expert)
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
    values on its returns. ``observations`` must already be normalised as the policy sees them."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate)
    obs_t, act_t = torch.as_tensor(observations, dtype=torch.float32), torch.as_tensor(actions)
    ret_t = torch.as_tensor(returns, dtype=torch.float32)
    policy.train()
    for _ in range(args.epochs):
        for batch in torch.randperm(len(obs_t), generator=generator).split(args.batch_size):
            values, log_prob, entropy = policy.evaluate_actions(obs_t[batch], act_t[batch])
            assert entropy is not None
            imitation = -log_prob.mean() - args.entropy_coef * entropy.mean()
            loss = imitation + 0.5 * torch.nn.functional.mse_loss(values.flatten(), ret_t[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    predicted, _ = policy.predict(observations, deterministic=True)
    agree = (predicted == actions).all(axis=1)
    return {"expert_agreement": float(agree.mean()), "decisions": len(obs_t)}
