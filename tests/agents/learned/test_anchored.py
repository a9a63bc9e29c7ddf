"""The clone's anchor during PPO: its gradient steps pull the policy back to the expert's decisions."""

from __future__ import annotations

import numpy as np
import torch
from stable_baselines3.common.vec_env import DummyVecEnv

from kdvfs.agents.learned.training.anchored import AnchoredPPO
from kdvfs.agents.learned.training.imitation import demonstrations
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv


def _model() -> tuple[AnchoredPPO, KernelDVFSEnv]:
    env = KernelDVFSEnv(plan_budgets=(0.0, 0.01), budgets=(0.005, 0.01), latency_scales=(0.0, 1.0))
    model = AnchoredPPO("MlpPolicy", DummyVecEnv([lambda: env]), n_steps=32, batch_size=32, n_epochs=1, seed=0,
                        device="cpu", policy_kwargs={"net_arch": [16]})
    return model, env


def _nll(model: AnchoredPPO, observations: np.ndarray, actions: np.ndarray) -> float:
    with torch.no_grad():
        _, log_prob, _ = model.policy.evaluate_actions(torch.as_tensor(observations), torch.as_tensor(actions))
    return float(-log_prob.mean())


def test_the_anchor_lowers_the_experts_negative_log_likelihood() -> None:
    model, env = _model()
    rng = np.random.default_rng(0)
    observations = rng.normal(size=(64, env.observation_space.shape[0])).astype(np.float32)
    actions = np.tile([1, env.advisor_action("fitting_plan")], (64, 1))
    before = _nll(model, observations, actions)
    model.anchor(observations, actions, coef=1.0, batches=300, batch_size=32, seed=0)
    model.learn(32)  # one rollout, one PPO update, then the anchor's 300 steps
    assert _nll(model, observations, actions) < 0.5 * before


def test_without_a_coefficient_ppo_runs_unanchored() -> None:
    model, env = _model()
    observations = np.zeros((8, env.observation_space.shape[0]), dtype=np.float32)
    model.anchor(observations, np.tile([1, 0], (8, 1)), coef=0.0, batches=4, batch_size=8, seed=0)
    model.learn(32)
    assert "anchor/expert_nll" not in model.logger.name_to_value


def test_demonstrations_cover_every_step_budget_and_latency() -> None:
    _, env = _model()
    demos = demonstrations(env)
    assert {(d.index, d.budget, d.latency_scale) for d in demos} == {(0, b, s) for b in (0.005, 0.01)
                                                                     for s in (0.0, 1.0)}
