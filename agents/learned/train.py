"""Train a clock policy for one GPU with PPO, top to bottom: price the steps (with the steps they execute
instead: :mod:`kdvfs.envs.env.shape_pairs`), build the envs and the model, clone the expert on every budget
and latency, freeze the observation statistics, learn anchored to the clone (TensorBoard logs, checkpoints,
held-out evaluations), then freeze the actor into one file: PPO's where it beats the clone on the validation
steps (``data.validation``: steps neither trained on nor held out; the training steps if it is empty;
paired episodes over every budget and latency, the 95% interval of the difference above 0), else the
clone's.

Everything a run writes goes to ``out``: ``run.json`` (command, resolved config, git revision, seed), ``config.yaml``
(the resolved config, its ``extends`` chain merged: a whole config by itself), ``tensorboard/``, ``checkpoints/``,
``model.zip`` and ``vecnormalize.pkl`` (SB3), ``policy.kdvfs-policy.npz`` (the frozen policy that ships),
``imitation.kdvfs-policy.npz`` and ``ppo.kdvfs-policy.npz`` (the clone before PPO and PPO's final policy) and
``summary.json`` (wall time, held-out results).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import VecNormalize

from kdvfs.agents.learned.anchored import AnchoredPPO
from kdvfs.agents.learned.frozen import SUFFIX, FrozenPolicy, freeze
from kdvfs.agents.learned.imitation import clone, demonstrations, record
from kdvfs.agents.learned.policy_planner import rollout
from kdvfs.agents.learned.ppo import EpisodeMetrics, TrainConfig, build_pairs, make_model, make_vec_env
from kdvfs.envs.common.config import to_plain
from kdvfs.envs.common.files import write_text_atomic
from kdvfs.envs.common.run_record import git_revision, write_run_record
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.shape_pairs import ShapePair
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.model.cost_model import Array

POLICY_FILE = f"policy{SUFFIX}"
CLONE_FILE = f"imitation{SUFFIX}"
PPO_FILE = f"ppo{SUFFIX}"
"""The clone before PPO and PPO's final policy, both kept whichever ships (``benchmarks/policies.py``)."""
SCORE_SEEDS = 2
"""Noise seeds per validation step, budget and latency when the clone and PPO's policy are compared."""
Z95 = 1.96
"""The normal quantile of a two-sided 95% interval (the paired comparisons have hundreds of pairs)."""


@dataclass(frozen=True)
class TrainResult:
    """What a run produced: its folder, the frozen policy, wall time (s), timesteps, held-out results."""

    out: Path
    policy_path: Path
    wall_s: float
    timesteps: int
    held_out: dict[str, dict[str, Any]]


def _silent(text: str) -> None:
    """The default stage report: nothing."""


def whole_rollouts(timesteps: int, n_steps: int, n_envs: int) -> int:
    """``timesteps`` rounded up to whole PPO rollouts (``n_steps`` per environment, ``n_envs`` environments): what
    ``PPO.learn`` trains for any request, so that the figure announced and the progress bar's total are true."""
    rollout = n_steps * n_envs
    return -(-timesteps // rollout) * rollout


def train(config: TrainConfig, out: Path, timesteps: int | None = None, progress_bar: bool = False,
          stage: Callable[[str], None] = _silent) -> TrainResult:
    """Train ``config`` (for ``timesteps`` instead of ``config.total_timesteps`` if given) into ``out``;
    ``stage`` is told, in a few words, each stage as it starts."""
    start = time.perf_counter()
    requested = timesteps or config.total_timesteps
    config = replace(config, total_timesteps=whole_rollouts(requested, config.ppo.n_steps, config.n_envs))
    if config.total_timesteps != requested:
        stage(f"{requested} timesteps rounded up to {config.total_timesteps}: PPO trains whole rollouts of "
              f"{config.ppo.n_steps} steps x {config.n_envs} environments")
    torch.set_num_threads(config.torch_threads)
    torch.distributions.Distribution.set_default_validate_args(False)  # ~10% faster rollouts
    out.mkdir(parents=True, exist_ok=True)
    write_run_record(out, to_plain(config), config.seed)
    write_text_atomic(out / "config.yaml", yaml.safe_dump(to_plain(config), sort_keys=False))

    stage(f"pricing every training and held-out step once on {config.gpu}")
    profile = load_profile(config.gpu)
    grid = config.env.grid(profile)
    train_pairs = build_pairs(config.data.train, profile, grid, progress_bar, "pricing training steps")
    held_out_pairs = build_pairs(config.data.held_out, profile, grid, progress_bar, "pricing held-out steps")
    validation_pairs = build_pairs(config.data.validation, profile, grid, progress_bar,
                                   "pricing validation steps") or train_pairs

    # Environments and model; a head start by cloning the plan advisors' expert, the observation statistics
    # frozen from then on (the clone's inputs stay what it was fitted on), then PPO anchored to the clone.
    env = make_vec_env(config, train_pairs, profile)
    model = make_model(config, env, out / "tensorboard")
    stage(f"imitation warm start on {len(train_pairs)} training steps, every budget and latency")
    imitation = imitate(model, env, config, profile, train_pairs)
    cloned = freeze_model(model, env, config, profile, {})
    evaluate = HeldOutEvaluation(config, profile, held_out_pairs, config.eval_every)
    checkpoints = CheckpointCallback(max(1, config.checkpoint_every // config.n_envs), str(out / "checkpoints"),
                                     name_prefix="ppo", save_vecnormalize=True)
    stage(f"PPO for {config.total_timesteps} timesteps ({config.n_envs} environments)")
    model.learn(config.total_timesteps, callback=CallbackList([EpisodeMetrics(), checkpoints, evaluate]),
                progress_bar=progress_bar)

    # Save and freeze; keep PPO's policy only if it beats the clone on paired validation episodes.
    stage(f"comparing PPO with its clone; scoring the policy on {len(held_out_pairs)} held-out steps")
    model.save(out / "model.zip")
    env.save(str(out / "vecnormalize.pkl"))
    ppo = freeze_model(model, env, config, profile, {})
    comparison = paired_comparison(ppo, cloned, validation_pairs, profile, config)
    selected = "ppo" if comparison["ci95"][0] > 0 else "imitation"
    meta = {"timesteps": int(model.num_timesteps), "train_wall_s": time.perf_counter() - start,
            "git_revision": git_revision(), "seed": config.seed, "imitation": imitation,
            "selection_comparison": comparison, "selected": selected}
    policy = replace(ppo, meta={**meta, **ppo.meta}) if selected == "ppo" else replace(cloned, meta=meta)
    policy_path = out / POLICY_FILE
    policy.save(policy_path)
    replace(cloned, meta={**meta, "selected": "imitation"}).save(out / CLONE_FILE)
    replace(ppo, meta={**meta, "selected": "ppo", **ppo.meta}).save(out / PPO_FILE)
    held_out = evaluate_steps(policy, held_out_pairs, profile, config)
    env.close()
    wall_s = time.perf_counter() - start
    summary = {"wall_s": wall_s, "timesteps": int(model.num_timesteps), "imitation": imitation,
               "selection_comparison": comparison, "selected": selected, "held_out": held_out,
               "train_steps": [p.predicted.name for p in train_pairs],
               "validation_steps": [p.predicted.name for p in validation_pairs]}
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return TrainResult(out, policy_path, wall_s, int(model.num_timesteps), held_out)


def imitate(model: AnchoredPPO, env: VecNormalize, config: TrainConfig, profile: GpuProfile,
            pairs: list[ShapePair]) -> dict[str, float]:
    """Clone the plan advisors' expert (:mod:`kdvfs.agents.learned.imitation`) into ``model``'s policy and critic
    on every step, budget and latency scale; the recorded observations set the env's normalisation
    statistics, which stay frozen from then on, and anchor PPO (:class:`AnchoredPPO`) to the expert."""
    expert_env = pair_env(pairs, profile, config.env)
    observations, actions, returns = record(expert_env, demonstrations(expert_env),
                                            config.imitation.episodes_per_step, config.ppo.gamma, config.seed,
                                            config.imitation.expert)
    assert isinstance(env.obs_rms, RunningMeanStd)
    env.obs_rms.update(observations)
    env.training = False  # frozen: PPO's rollouts no longer move the statistics the clone was fitted with
    normalised = env.normalize_obs(observations)
    assert isinstance(normalised, np.ndarray)
    result = clone(model.policy, normalised, actions, returns, config.imitation, config.seed)
    args = config.imitation
    model.anchor(normalised, actions, args.anchor_coef, args.anchor_batches, args.batch_size, config.seed)
    return result


def pair_env(pairs: list[ShapePair], profile: GpuProfile, env_config: EnvConfig, **settings: Any) -> KernelDVFSEnv:
    """One environment over ``pairs``: each episode observes a pair's predicted step and executes one of its
    variants; ``settings`` replace fields of ``env_config``."""
    return KernelDVFSEnv([p.predicted for p in pairs], profile, env_config, executed=[p.executed for p in pairs],
                         **settings)


def freeze_model(model: Any, env: VecNormalize, config: TrainConfig, profile: GpuProfile,
                 meta: dict[str, Any]) -> FrozenPolicy:
    """The model's actor with the env's current observation statistics, as a :class:`FrozenPolicy`."""
    spec = env.get_attr("observation_spec", [0])[0]
    stats = env.obs_rms
    assert isinstance(stats, RunningMeanStd)
    mean, var = (stats.mean, stats.var) if config.vec_normalize.norm_obs else (np.zeros(spec.size), np.ones(spec.size))
    return freeze(model, mean, var, env.clip_obs, env.epsilon, profile.name, spec, config.env,
                  {**meta, "config": to_plain(config)})


def evaluate_steps(policy: FrozenPolicy, pairs: list[ShapePair], profile: GpuProfile,
                   config: TrainConfig) -> dict[str, dict[str, Any]]:
    """Deterministic rollouts (one step, no disturbance, the first executed variant: the real step) at the
    first training budget, per step name."""
    env = pair_env([ShapePair(p.predicted, p.executed[:1]) for p in pairs], profile,
                   config.env.without_disturbances().replace(run_steps=1, latency_scales=(1.0,)),
                   budgets=config.env.budgets[:1])
    return {pair.predicted.name: rollout(policy, env, {"step": i}) for i, pair in enumerate(pairs)}


def paired_returns(policy: FrozenPolicy, pairs: list[ShapePair], profile: GpuProfile, config: TrainConfig) -> Array:
    """Returns (the sum of the environment's rewards: energy saved % - overrun penalties) of the deterministic
    policy on every step of ``pairs``, budget and switching regime, with the environment's noise and executed
    variants, seeds 0..SCORE_SEEDS-1, in a fixed order (two policies' arrays pair up)."""
    env = pair_env(pairs, profile, config.env)
    return np.array([rollout(policy, env, {"step": i, "budget": budget, "latency_scale": scale}, seed)["return"]
                     for i in range(len(pairs)) for budget in config.env.budgets
                     for scale in config.env.latency_scales for seed in range(SCORE_SEEDS)])


def paired_comparison(ppo: FrozenPolicy, cloned: FrozenPolicy, pairs: list[ShapePair], profile: GpuProfile,
                      config: TrainConfig) -> dict[str, Any]:
    """PPO's return minus the clone's on the same episodes (:func:`paired_returns`): mean, 95% interval, pairs."""
    delta = paired_returns(ppo, pairs, profile, config) - paired_returns(cloned, pairs, profile, config)
    half = Z95 * float(delta.std(ddof=1)) / np.sqrt(len(delta)) if len(delta) > 1 else float("inf")
    mean = float(delta.mean())
    return {"delta_return": mean, "ci95": [mean - half, mean + half], "pairs": len(delta)}


class HeldOutEvaluation(BaseCallback):
    """Every ``every`` timesteps, logs the deterministic policy's mean result on the held-out steps
    (monitoring only: nothing is selected by it)."""

    def __init__(self, config: TrainConfig, profile: GpuProfile, pairs: list[ShapePair], every: int) -> None:
        super().__init__()
        self.config, self.profile, self.pairs, self.every = config, profile, pairs, every
        self._next = every

    def _on_step(self) -> bool:
        if self.num_timesteps >= self._next and self.pairs:
            self._next += self.every
            env = self.model.get_env()
            assert isinstance(env, VecNormalize)
            policy = freeze_model(self.model, env, self.config, self.profile, {})
            results = evaluate_steps(policy, self.pairs, self.profile, self.config).values()
            for key in ("energy_saved_pct", "slowdown_pct", "overrun_pct", "switches"):
                self.logger.record(f"held_out/{key}", float(np.mean([r[key] for r in results])))
        return True
