"""PPO for ``KernelDVFS-v0`` with stable-baselines3: the training config, the vectorised envs, the model.

``configs/ppo/<gpu>.yaml`` loads strictly (unknown keys are errors) into :class:`TrainConfig`; its ``ppo``
section holds arguments of ``stable_baselines3.PPO`` under SB3's own names, ``vec_normalize`` those of
``VecNormalize``, ``env`` the environment's settings (:class:`~kdvfs.envs.env.config.EnvConfig`, clock grid
included), ``data`` the train/held-out split.

Layering: a config file may name a base with ``extends: <base>``; it is then laid over the base's mapping by
:func:`~kdvfs.common.config.merge_mappings` (mappings merge key by key, recursively; any other value,
lists and null included, replaces the base's whole) before the strict load. ``<base>`` is a bundled PPO config
name (``default``) or, when it ends in ``.yaml``/``.yml``, a file path relative to the extending file's folder;
bases may extend bases (a cycle is an error). ``configs/ppo/default.yaml`` holds what every GPU shares and
names no GPU; each ``configs/ppo/<gpu>.yaml`` extends it with what differs. A file without ``extends`` is a
whole config by itself (as every run's saved ``config.yaml`` is).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    SubprocVecEnv,
    VecEnv,
    VecEnvWrapper,
    VecMonitor,
    VecNormalize,
)

from kdvfs.agents.learned.training.anchored import AnchoredPPO
from kdvfs.agents.learned.training.imitation import ImitationArgs
from kdvfs.agents.learned.training.lagrange import CellMultipliers, ConstraintArgs, LagrangianReward
from kdvfs.common.config import ConfigError, from_mapping, load_yaml, merge_mappings
from kdvfs.common.paths import CONFIG_DIR
from kdvfs.common.resolve import resolve_shipped
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import ENV_ID
from kdvfs.envs.env.residual_env import RESIDUAL_ENV_ID
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.shape_pairs import ShapePair
from kdvfs.envs.env.steps.workloads import DataSplit, WorkloadSet
from kdvfs.envs.gpu.profiles import GpuProfile

PPO_CONFIG_DIR = CONFIG_DIR / "ppo"
DEFAULT_CONFIG = "default"
"""The bundled base every GPU's config extends (no config of a GPU by itself)."""
EXTENDS_KEY = "extends"
ACTIVATIONS = ("tanh", "relu")
VEC_ENVS = ("dummy", "subprocess")
EPISODE_METRICS = ("energy_saved_pct", "slowdown_pct", "overrun_pct", "switches")


@dataclass(frozen=True)
class NetArch:
    """Hidden layer sizes of the actor (``pi``) and critic (``vf``) MLPs."""

    pi: tuple[int, ...]
    vf: tuple[int, ...]


@dataclass(frozen=True)
class PolicyKwargs:
    """SB3 ``policy_kwargs``; ``activation_fn`` by name (``tanh`` or ``relu``)."""

    net_arch: NetArch
    activation_fn: str = "tanh"

    def __post_init__(self) -> None:
        if self.activation_fn not in ACTIVATIONS:
            raise ConfigError(f"activation_fn {self.activation_fn!r} must be one of {list(ACTIVATIONS)}")

    def for_sb3(self) -> dict[str, Any]:
        import torch

        activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[self.activation_fn]
        return {"net_arch": {"pi": list(self.net_arch.pi), "vf": list(self.net_arch.vf)}, "activation_fn": activation}


@dataclass(frozen=True)
class PpoArgs:
    """Arguments of ``stable_baselines3.PPO`` (same names, same meaning)."""

    learning_rate: float
    n_steps: int
    batch_size: int
    n_epochs: int
    gamma: float
    gae_lambda: float
    clip_range: float
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    policy_kwargs: PolicyKwargs
    target_kl: float | None = None


@dataclass(frozen=True)
class VecNormalizeArgs:
    """Arguments of ``stable_baselines3.common.vec_env.VecNormalize`` (rewards are never normalised)."""

    norm_obs: bool = True
    clip_obs: float = 10.0
    epsilon: float = 1e-8


@dataclass(frozen=True)
class TrainConfig:
    """One training run.

    Attributes:
        gpu: GPU profile name the policy is trained for.
        seed: seeds PPO, the environments and the data.
        total_timesteps: environment steps (kernel decisions) to train for.
        n_envs: environments stepped together.
        vec_env: ``dummy`` (in this process) or ``subprocess`` (one process each).
        torch_threads: CPU threads for torch.
        request_prior: the untrained policy's probability of requesting new clocks at a decision point (most
            random clocks overrun the budget badly, so exploration starts close to the default behaviour).
        checkpoint_every: save a checkpoint every this many timesteps.
        eval_every: evaluate the deterministic policy on the held-out steps every this many timesteps.
        env: the environment's settings (its clock grid included).
        ppo: PPO arguments.
        vec_normalize: observation normalisation.
        imitation: behaviour cloning of the latency-aware optimum before PPO.
        data: the train/held-out split.
        constraint: with residual actions, the budget constraint (a Lagrange multiplier per budget x latency cell,
            :mod:`kdvfs.agents.learned.training.lagrange`); None: none (the environment's penalties only).
    """

    gpu: str
    seed: int
    total_timesteps: int
    n_envs: int
    vec_env: str
    torch_threads: int
    request_prior: float
    checkpoint_every: int
    eval_every: int
    env: EnvConfig
    ppo: PpoArgs
    vec_normalize: VecNormalizeArgs
    imitation: ImitationArgs
    data: DataSplit
    constraint: ConstraintArgs | None = None

    def __post_init__(self) -> None:
        if self.vec_env not in VEC_ENVS:
            raise ConfigError(f"vec_env {self.vec_env!r} must be one of {list(VEC_ENVS)}")
        for name in ("total_timesteps", "n_envs", "torch_threads", "checkpoint_every", "eval_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if not 0.0 < self.request_prior < 1.0:
            raise ConfigError(f"request_prior {self.request_prior} must be in (0, 1)")
        if self.constraint is not None and not self.env.residual_actions:
            raise ConfigError("constraint needs env.residual_actions (its episodes report their violations)")


def train_config_path(gpu_or_path: str | Path) -> Path:
    """An existing YAML file ``gpu_or_path``, else the bundled ``configs/ppo/<gpu>.yaml``.

    Raises:
        ConfigError: no such file or bundled config (the message lists the bundled GPUs), or the name of the
            shared base (``default``), which is no GPU's config.
    """
    if str(gpu_or_path) == DEFAULT_CONFIG and not Path(gpu_or_path).is_file():
        raise ConfigError(f"{PPO_CONFIG_DIR / DEFAULT_CONFIG}.yaml is what every GPU's PPO config extends, not a "
                          "config by itself; name a GPU (--gpu) or pass a config file with --config")
    return resolve_shipped(gpu_or_path, PPO_CONFIG_DIR, ".yaml", "PPO config", error=ConfigError,
                           hint=" with --config", hidden=(DEFAULT_CONFIG,))


def _base_path(name: Any, path: Path) -> Path:
    """The file an ``extends: name`` in ``path`` names (see the module docstring)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: {EXTENDS_KEY}: expected a PPO config name or a .yaml path, got {name!r}")
    if name.endswith((".yaml", ".yml")):
        base = path.parent / name
        if not base.is_file():
            raise ConfigError(f"{path}: {EXTENDS_KEY}: {base}: no such file")
        return base
    bundled = PPO_CONFIG_DIR / f"{name}.yaml"
    if not bundled.is_file():
        raise ConfigError(f"{path}: {EXTENDS_KEY}: no bundled PPO config {name!r} ({bundled})")
    return bundled


def train_config_mapping(gpu_or_path: str | Path) -> Any:
    """The raw mapping a PPO config resolves to: its file (:func:`train_config_path`) laid over its ``extends``
    chain, the key ``extends`` removed. Not validated here (see :func:`load_train_config`).

    Raises:
        ConfigError: a missing or unreadable file in the chain, a bad ``extends`` value, or a cycle.
    """
    path = train_config_path(gpu_or_path)
    seen: list[Path] = []
    layers: list[Any] = []
    while True:
        if path.resolve() in seen:
            chain = " -> ".join(str(p) for p in [*seen, path.resolve()])
            raise ConfigError(f"{path}: {EXTENDS_KEY} makes a cycle: {chain}")
        seen.append(path.resolve())
        data = load_yaml(path)
        if not isinstance(data, dict) or EXTENDS_KEY not in data:
            layers.append(data)
            break
        layers.append({k: v for k, v in data.items() if k != EXTENDS_KEY})
        path = _base_path(data[EXTENDS_KEY], path)
    merged = layers.pop()
    for layer in reversed(layers):
        merged = merge_mappings(merged, layer)
    return merged


def load_train_config(gpu_or_path: str | Path) -> TrainConfig:
    """``configs/ppo/<gpu>.yaml`` by GPU name, or any YAML file, with its ``extends`` chain merged
    (:func:`train_config_mapping`), loaded strictly into :class:`TrainConfig`.

    Raises:
        ConfigError: the file cannot be resolved or read, or the merged mapping has unknown, missing or
            ill-typed keys or invalid values (the message names the file and the key path).
    """
    path = train_config_path(gpu_or_path)
    return from_mapping(TrainConfig, train_config_mapping(path), str(path))


def build_pairs(workloads: WorkloadSet, profile: GpuProfile, grid: ClockGrid, progress_bar: bool = False,
                label: str = "pricing steps") -> list[ShapePair]:
    """Every step of ``workloads`` priced on ``profile`` for the environment, with its executed variants
    (:meth:`WorkloadSet.pairs`); ``progress_bar``: a tqdm bar on stderr."""
    if not progress_bar:
        return workloads.pairs(profile, grid)
    from tqdm import tqdm

    with tqdm(desc=label, total=workloads.size(), unit="step", leave=False) as bar:
        return workloads.pairs(profile, grid, bar.update)


def make_vec_env(config: TrainConfig, pairs: Sequence[ShapePair], profile: GpuProfile) -> VecNormalize:
    """``config.n_envs`` environments over ``pairs`` (each episode observes a pair's predicted step and executes
    one of its variants; ``KernelDVFSResidual-v0`` with residual actions), with the budget multipliers' rewards when
    the config has a constraint (:attr:`constrained`), monitored, observations normalised (PPO seeds them)."""
    steps, executed = [p.predicted for p in pairs], [p.executed for p in pairs]
    env_id = RESIDUAL_ENV_ID if config.env.residual_actions else ENV_ID

    def make() -> gym.Env:
        return gym.make(env_id, steps=steps, gpu=profile, config=config.env, executed=executed)

    makers = [make] * config.n_envs
    vec: VecEnv = SubprocVecEnv(makers) if config.vec_env == "subprocess" else DummyVecEnv(makers)
    if config.constraint is not None:
        vec = LagrangianReward(vec, CellMultipliers(config.env.budgets, config.env.latency_scales, config.constraint))
    norm = config.vec_normalize
    return VecNormalize(VecMonitor(vec), norm_obs=norm.norm_obs, norm_reward=False,
                        clip_obs=norm.clip_obs, gamma=config.ppo.gamma, epsilon=norm.epsilon)


def constrained(env: VecNormalize) -> LagrangianReward | None:
    """The budget multipliers' wrapper inside ``env`` (:func:`make_vec_env`), if any."""
    inner = env.venv
    while isinstance(inner, VecEnvWrapper):
        if isinstance(inner, LagrangianReward):
            return inner
        inner = inner.venv
    return None


def make_model(config: TrainConfig, env: VecNormalize, tensorboard_dir: Path | None) -> AnchoredPPO:
    """An untrained PPO (anchored once :meth:`AnchoredPPO.anchor` is called) with an MLP policy and the config's
    arguments."""
    import torch

    args = {k: v for k, v in asdict(config.ppo).items() if k != "policy_kwargs"}
    model = AnchoredPPO("MlpPolicy", env, policy_kwargs=config.ppo.policy_kwargs.for_sb3(), seed=config.seed,
                        device="cpu", tensorboard_log=str(tensorboard_dir) if tensorboard_dir else None, verbose=0,
                        **args)
    if config.env.residual_actions:
        return model  # the clone of the zero action sets its first probabilities
    with torch.no_grad():  # the action head starts near zero weights: its biases set the first probabilities
        request_logit = math.log(config.request_prior / (1 - config.request_prior))
        bias = model.policy.action_net.bias
        assert isinstance(bias, torch.Tensor)
        bias[:2] = torch.tensor([0.0, request_logit])
    return model


class EpisodeMetrics(BaseCallback):
    """Logs the mean energy saved, slowdown, budget overrun and switches of the episodes of each rollout."""

    def __init__(self) -> None:
        super().__init__()
        self._episodes: list[dict[str, Any]] = []

    def _on_step(self) -> bool:
        for info, done in zip(self.locals["infos"], self.locals["dones"], strict=True):
            if done and "energy_saved_pct" in info:
                self._episodes.append(info)
        return True

    def _on_rollout_end(self) -> None:
        if self._episodes:
            for key in EPISODE_METRICS:
                self.logger.record(f"episode/{key}", float(np.mean([e[key] for e in self._episodes])))
            self._episodes = []
