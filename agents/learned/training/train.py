"""Train a clock policy for one GPU with PPO, top to bottom: price the steps (with the steps they execute instead:
:mod:`kdvfs.envs.env.steps.shape_pairs`), build the envs and the model, clone the expert on every budget and
latency, freeze the observation statistics, learn (anchored to the clone; with residual actions under a Lagrange
multiplier per budget x latency cell, :mod:`kdvfs.agents.learned.training.lagrange`), then freeze the actor into one
file. Every choice is made on the validation steps (``data.validation``; the training steps if empty); nothing held
out is priced or scored here. PPO ships where it beats on validation (paired episodes, the 95% interval above 0) the
best fixed-margin fitting plan of each cell with residual actions
(:mod:`kdvfs.agents.learned.training.margin_plans`), else the clone; otherwise the clone ships.

``out`` receives ``run.json`` (command, resolved config, git revision, seed), ``config.yaml`` (the resolved
config), ``tensorboard/``, ``checkpoints/``, ``model.zip`` and ``vecnormalize.pkl`` (SB3), the frozen policies
``policy`` (ships), ``imitation`` and ``ppo`` (``.kdvfs-policy.npz``) and ``summary.json`` (wall time, the
selection's comparison, the multipliers, the cells at the cap and the cells over the target at the end); one git
revision, read at the start, is recorded in all of them.
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

from kdvfs.agents.learned.policy.frozen import FrozenPolicy, freeze
from kdvfs.agents.learned.policy.policy_planner import rollout
from kdvfs.agents.learned.training.anchored import AnchoredPPO
from kdvfs.agents.learned.training.imitation import clone, demonstrations, record
from kdvfs.agents.learned.training.lagrange import MultiplierCallback
from kdvfs.agents.learned.training.margin_plans import (
    COMPLIANCE,
    best_margins,
    chosen,
    episodes,
    margin_actors,
    score_seeds,
    within,
)
from kdvfs.agents.learned.training.most_likely import MostLikelyEpisodes
from kdvfs.agents.learned.training.ppo import (
    EpisodeMetrics,
    TrainConfig,
    build_pairs,
    constrained,
    make_model,
    make_vec_env,
)
from kdvfs.common.arrays import Array
from kdvfs.common.config import to_plain
from kdvfs.common.files import write_text_atomic
from kdvfs.common.paths import POLICY_SUFFIX
from kdvfs.common.run_record import git_revision, write_run_record
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.residual_env import ResidualDVFSEnv
from kdvfs.envs.env.steps.shape_pairs import ShapePair
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile

POLICY_FILE = f"policy{POLICY_SUFFIX}"
CLONE_FILE = f"imitation{POLICY_SUFFIX}"
PPO_FILE = f"ppo{POLICY_SUFFIX}"
"""The clone before PPO and PPO's final policy, both kept whichever ships (``benchmarks/policies.py``)."""
Z95 = 1.96
"""The normal quantile of a two-sided 95% interval (the paired comparisons have hundreds of pairs)."""


def _silent(text: str) -> None:
    """The default stage report: nothing."""


@dataclass
class TrainingData:
    """What every seed of one config trains and is chosen on, priced once: the GPU's profile, the training and
    validation pairs, the git revision of the code (read when priced: the code every seed of the process runs,
    whatever the tree holds by the time a later seed starts), and (computed at the first use, then kept) the
    fixed-margin plans' validation episodes (:func:`margin_comparison`: the same for every seed)."""

    profile: GpuProfile
    train_pairs: list[ShapePair]
    validation_pairs: list[ShapePair]
    revision: str
    plan_episodes: Array | None = None

    @classmethod
    def price(cls, config: TrainConfig, progress_bar: bool = False, stage: Callable[[str], None] = _silent,
              revision: str | None = None) -> TrainingData:
        """Price ``config``'s training and validation steps on its GPU (the training steps validate when the
        config has no validation steps); ``stage`` is told. ``revision``: the code's, read by the caller; None:
        read now."""
        stage(f"pricing every training and validation step once on {config.gpu}")
        revision = git_revision() if revision is None else revision
        profile = load_profile(config.gpu)
        grid = config.env.grid(profile)
        train_pairs = build_pairs(config.data.train, profile, grid, progress_bar, "pricing training steps")
        validation_pairs = build_pairs(config.data.validation, profile, grid, progress_bar,
                                       "pricing validation steps") or train_pairs
        return cls(profile, train_pairs, validation_pairs, revision)


@dataclass(frozen=True)
class TrainResult:
    """What a run produced: its folder, the frozen policy, wall time (s), timesteps, which candidate ships
    (``ppo`` or ``imitation``) and the validation comparison it was chosen by."""

    out: Path
    policy_path: Path
    wall_s: float
    timesteps: int
    selected: str
    comparison: dict[str, Any]


def whole_rollouts(timesteps: int, n_steps: int, n_envs: int) -> int:
    """``timesteps`` rounded up to whole PPO rollouts (``n_steps`` per environment, ``n_envs`` environments): what
    ``PPO.learn`` trains for any request, so that the figure announced and the progress bar's total are true."""
    rollout = n_steps * n_envs
    return -(-timesteps // rollout) * rollout


def train(config: TrainConfig, out: Path, timesteps: int | None = None, progress_bar: bool = False,
          stage: Callable[[str], None] = _silent, data: TrainingData | None = None) -> TrainResult:
    """Train ``config`` (for ``timesteps`` instead of ``config.total_timesteps`` if given) into ``out``;
    ``stage`` is told, in a few words, each stage as it starts. ``data``: the config's steps already priced
    (:meth:`TrainingData.price`, e.g. by the run of another seed); None: priced here."""
    start = time.perf_counter()
    requested = timesteps or config.total_timesteps
    config = replace(config, total_timesteps=whole_rollouts(requested, config.ppo.n_steps, config.n_envs))
    if config.total_timesteps != requested:
        stage(f"{requested} timesteps rounded up to {config.total_timesteps}: PPO trains whole rollouts of "
              f"{config.ppo.n_steps} steps x {config.n_envs} environments")
    torch.set_num_threads(config.torch_threads)
    torch.distributions.Distribution.set_default_validate_args(False)  # ~10% faster rollouts
    out.mkdir(parents=True, exist_ok=True)
    revision = data.revision if data is not None else git_revision()
    write_run_record(out, to_plain(config), config.seed, revision)
    write_text_atomic(out / "config.yaml", yaml.safe_dump(to_plain(config), sort_keys=False))

    data = data or TrainingData.price(config, progress_bar, stage, revision)
    profile, train_pairs, validation_pairs = data.profile, data.train_pairs, data.validation_pairs

    # Environments and model; a head start by cloning the expert, the observation statistics frozen from then
    # on (the clone's inputs stay what it was fitted on), then PPO (anchored to the clone, constrained).
    env = make_vec_env(config, train_pairs, profile)
    model = make_model(config, env, out / "tensorboard")
    stage(f"imitation warm start on {len(train_pairs)} training steps, every budget and latency")
    imitation = imitate(model, env, config, profile, train_pairs)
    cloned = freeze_model(model, env, config, profile, {})
    checkpoints = CheckpointCallback(max(1, config.checkpoint_every // config.n_envs), str(out / "checkpoints"),
                                     name_prefix="ppo", save_vecnormalize=True)
    callbacks: list[BaseCallback] = [EpisodeMetrics(), checkpoints]
    wrapper = constrained(env)
    if wrapper is not None:
        callbacks.append(MultiplierCallback(wrapper, most_likely_episodes(config, train_pairs, profile)))
    stage(f"PPO for {config.total_timesteps} timesteps ({config.n_envs} environments)")
    model.learn(config.total_timesteps, callback=CallbackList(callbacks), progress_bar=progress_bar)

    # Save and freeze; keep PPO's policy only if it beats the bar on validation episodes.
    stage(f"comparing PPO with the bar on {len(validation_pairs)} validation steps")
    model.save(out / "model.zip")
    env.save(str(out / "vecnormalize.pkl"))
    ppo = freeze_model(model, env, config, profile, {})
    if config.env.residual_actions:
        if data.plan_episodes is None:
            data.plan_episodes = episodes(margin_actors(), validation_pairs, profile, config.env,
                                            score_seeds(validation_pairs))
        comparison = margin_comparison(ppo, validation_pairs, profile, config, data.plan_episodes)
        selected = "ppo" if comparison["beats_margin_plans"] else "imitation"
    else:
        comparison = paired_comparison(ppo, cloned, validation_pairs, profile, config)
        selected = "ppo" if comparison["ci95"][0] > 0 else "imitation"
    constraint = {"multipliers": None, "infeasible_cells": None, "unheld_cells": None} if wrapper is None else {
        "multipliers": wrapper.multipliers.by_cell(), "infeasible_cells": wrapper.multipliers.capped(),
        "unheld_cells": wrapper.multipliers.unheld()}
    meta = {"timesteps": int(model.num_timesteps), "train_wall_s": time.perf_counter() - start,
            "git_revision": revision, "seed": config.seed, "imitation": imitation,
            "selection_comparison": comparison, "selected": selected, **constraint}
    policy = replace(ppo, meta={**meta, **ppo.meta}) if selected == "ppo" else replace(cloned, meta=meta)
    policy_path = out / POLICY_FILE
    policy.save(policy_path)
    replace(cloned, meta={**meta, "selected": "imitation"}).save(out / CLONE_FILE)
    replace(ppo, meta={**meta, "selected": "ppo", **ppo.meta}).save(out / PPO_FILE)
    env.close()
    wall_s = time.perf_counter() - start
    summary = {"wall_s": wall_s, "timesteps": int(model.num_timesteps), "git_revision": revision,
               "imitation": imitation, "selection_comparison": comparison, "selected": selected,
               **constraint, "train_steps": [p.predicted.name for p in train_pairs],
               "validation_steps": [p.predicted.name for p in validation_pairs]}
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return TrainResult(out, policy_path, wall_s, int(model.num_timesteps), selected, comparison)


def imitate(model: AnchoredPPO, env: VecNormalize, config: TrainConfig, profile: GpuProfile,
            pairs: list[ShapePair]) -> dict[str, float]:
    """Clone the plan advisors' expert (:mod:`kdvfs.agents.learned.training.imitation`) into ``model``'s policy and
    critic on every step, budget and latency scale; the recorded observations set the env's normalisation
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


def most_likely_episodes(config: TrainConfig, pairs: list[ShapePair], profile: GpuProfile) -> MostLikelyEpisodes | None:
    """The constraint's episodes of the most likely policy (``config.constraint.most_likely_episodes`` per budget x
    latency cell of ``config.env``) on ``config.n_envs`` environments over the training ``pairs``, seeded from
    ``config.seed``; None when the config asks for none."""
    if config.constraint is None or config.constraint.most_likely_episodes == 0:
        return None
    envs = [pair_env(pairs, profile, config.env) for _ in range(config.n_envs)]
    return MostLikelyEpisodes(envs, config.env.budgets, config.env.latency_scales,
                              config.constraint.most_likely_episodes, config.seed)


def pair_env(pairs: list[ShapePair], profile: GpuProfile, env_config: EnvConfig, **settings: Any) -> KernelDVFSEnv:
    """One environment over ``pairs``: each episode observes a pair's predicted step and executes one of its
    variants (``KernelDVFSResidual-v0`` with residual actions); ``settings`` replace fields of ``env_config``."""
    kind = ResidualDVFSEnv if env_config.residual_actions else KernelDVFSEnv
    return kind([p.predicted for p in pairs], profile, env_config, executed=[p.executed for p in pairs], **settings)


def freeze_model(model: Any, env: VecNormalize, config: TrainConfig, profile: GpuProfile,
                 meta: dict[str, Any]) -> FrozenPolicy:
    """The model's actor with the env's current observation statistics, as a :class:`FrozenPolicy`."""
    spec = env.get_attr("policy_spec" if config.env.residual_actions else "observation_spec", [0])[0]
    stats = env.obs_rms
    assert isinstance(stats, RunningMeanStd)
    mean, var = (stats.mean, stats.var) if config.vec_normalize.norm_obs else (np.zeros(spec.size), np.ones(spec.size))
    return freeze(model, mean, var, env.clip_obs, env.epsilon, profile.name, spec, config.env,
                  {**meta, "config": to_plain(config)})


def paired_returns(policy: FrozenPolicy, pairs: list[ShapePair], profile: GpuProfile, config: TrainConfig) -> Array:
    """Returns (the sum of the environment's rewards: energy saved % - overrun penalties) of the deterministic
    policy on every step of ``pairs``, budget and switching regime, with the environment's noise and executed
    variants, seeds 0..score_seeds(pairs)-1 (every variant), in a fixed order (two policies' arrays pair up)."""
    env, seeds = pair_env(pairs, profile, config.env), score_seeds(pairs)
    return np.array([rollout(policy, env, {"step": i, "budget": budget, "latency_scale": scale}, seed)["return"]
                     for i in range(len(pairs)) for budget in config.env.budgets
                     for scale in config.env.latency_scales for seed in range(seeds)])


def paired_comparison(ppo: FrozenPolicy, cloned: FrozenPolicy, pairs: list[ShapePair], profile: GpuProfile,
                      config: TrainConfig) -> dict[str, Any]:
    """PPO's return minus the clone's on the same episodes (:func:`paired_returns`): mean, 95% interval, pairs."""
    delta = paired_returns(ppo, pairs, profile, config) - paired_returns(cloned, pairs, profile, config)
    half = Z95 * float(delta.std(ddof=1)) / np.sqrt(len(delta)) if len(delta) > 1 else float("inf")
    mean = float(delta.mean())
    return {"delta_return": mean, "ci95": [mean - half, mean + half], "pairs": len(delta)}


def margin_comparison(ppo: FrozenPolicy, pairs: list[ShapePair], profile: GpuProfile, config: TrainConfig,
                      plans: Array) -> dict[str, Any]:
    """PPO against the best fixed-margin fitting plan of each budget x latency cell on the validation ``pairs``
    (:mod:`kdvfs.agents.learned.training.margin_plans`, :func:`score_seeds` seeds; ``plans``: the plans' episodes
    there, ``episodes(margin_actors(), pairs, profile, config.env, score_seeds(pairs))``): PPO's share of episodes
    within budget, its saving minus the plan's on the same episodes (mean, 95% interval over the pairs' means), its
    share per cell (budgets x latencies of ``CELL_BUDGETS`` x ``CELL_LATENCY_SCALES``), the margins chosen, and
    whether PPO beats them (within budget in >= 95% of every cell's episodes and the interval above 0)."""
    margins = best_margins(plans)
    bar = chosen(plans, margins)
    mine = episodes({"ppo": ppo}, pairs, profile, config.env, score_seeds(pairs))[0]
    per_pair = (mine[..., 0] - bar[..., 0]).mean(axis=(1, 2, 3))
    mean = float(per_pair.mean())
    half = Z95 * float(per_pair.std(ddof=1)) / np.sqrt(len(per_pair)) if len(per_pair) > 1 else float("inf")
    cells = within(mine).mean(axis=(0, 3))
    return {"delta_saved_pct": mean, "ci95": [mean - half, mean + half], "pairs": len(per_pair),
            "within_budget_ppo": float(within(mine).mean()), "within_budget_plans": float(within(bar).mean()),
            "min_cell_within_budget_ppo": float(cells.min()), "cells_within_budget_ppo": cells.tolist(),
            "margins": margins.tolist(),
            "beats_margin_plans": bool(cells.min() >= COMPLIANCE and mean - half > 0)}
