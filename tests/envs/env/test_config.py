"""EnvConfig: the one source of the environment's settings (YAML, constructor, frozen policies, docs)."""

from __future__ import annotations

import inspect
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.training.ppo import load_train_config, train_config_mapping
from kdvfs.common.config import ConfigError
from kdvfs.common.errors import KdvfsError
from kdvfs.common.paths import REPO_ROOT, shipped_policy_path
from kdvfs.envs.env.config import EnvConfig, Switching, settings_table
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.workloads import default_step
from kdvfs.envs.gpu.profiles import load_profile


@pytest.mark.parametrize("gpu", ["h200", "b200", "h100-sxm", "a100-sxm4", "rtx3080ti"])
def test_the_yaml_env_section_is_the_shipped_policys_config_or_a_v5_policy_still_ships(gpu: str) -> None:
    """A residual policy ships only once it beats the fixed-margin plans on validation
    (``agents/learned/training/train.py``); until then the v5 plan-choice policy stays, on the same clock grid."""
    profile, config = load_profile(gpu), load_train_config(gpu)
    raw = train_config_mapping(gpu)["env"]
    assert isinstance(config.env, EnvConfig) and set(raw) <= set(EnvConfig.__dataclass_fields__)
    policy = FrozenPolicy.load(shipped_policy_path(gpu), profile)
    if policy.config.residual_actions:
        assert policy.config == config.env and policy.spec(profile).hash() == policy.spec_hash
    else:
        assert policy.config == config.env and policy.grid(profile) == config.env.grid(profile)


def test_gym_make_gives_the_environment_the_shipped_policies_were_trained_in() -> None:
    """One source: ``EnvConfig``'s defaults are ``KernelDVFS-v0``'s, the shipped H200 policy's and what
    ``configs/ppo/h200.yaml`` resolves to; ``KernelDVFSResidual-v0``'s are its experimental config's."""
    policy = FrozenPolicy.load(shipped_policy_path("h200"), load_profile("h200"))
    config = gym.make("KernelDVFS-v0").unwrapped.config  # type: ignore[attr-defined]
    assert config == EnvConfig() == load_train_config("h200").env == policy.config
    residual = gym.make("KernelDVFSResidual-v0").unwrapped.config  # type: ignore[attr-defined]
    assert residual == load_train_config("residual-h200").env


def test_settings_by_name_replace_the_configs() -> None:
    env = KernelDVFSEnv(config=EnvConfig(budgets=(0.02,), overrun_penalty=5.0), duration_noise=0.0)
    assert env.config == EnvConfig(budgets=(0.02,), overrun_penalty=5.0, duration_noise=0.0)
    with pytest.raises(KdvfsError, match=r"unknown environment setting.*'budget'"):
        KernelDVFSEnv(budget=0.02)


def test_switching_defaults_come_from_the_profile() -> None:
    profile = load_profile("h200")
    mean_s, std_s, stall_s = (profile.switching.latency_mean_s, profile.switching.latency_std_s,
                              profile.cost_param("switch_stall_s"))
    assert EnvConfig().switching(profile) == Switching(mean_s, std_s, stall_s)
    assert EnvConfig(latency_s=0.0).switching(profile) == Switching(0.0, 0.0, 0.0)
    assert EnvConfig(latency_s=0.002, latency_std_s=0.0, stall_s=1e-4).switching(profile) == (0.002, 0.0, 1e-4)


def test_invalid_settings_are_errors_naming_the_yaml_key(tmp_path: Path) -> None:
    with pytest.raises(KdvfsError, match="budgets"):
        EnvConfig(budgets=())
    with pytest.raises(KdvfsError, match="next_kernels"):
        EnvConfig(next_kernels=0)
    raw = train_config_mapping("h200")
    raw["env"]["window_latencies"] = [0.0]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"bad\.yaml: env: .*window_latencies"):
        load_train_config(path)


def test_steps_must_be_priced_on_the_configs_grid() -> None:
    profile = load_profile("h200")
    other = default_step(profile, ClockGrid.for_profile(profile, (1.0, 0.9)))
    with pytest.raises(KdvfsError, match="same clock grid"):
        KernelDVFSEnv([other], profile)
    assert KernelDVFSEnv([other], profile, core_fractions=(1.0, 0.9), every_core_clock=False).grid == other.grid


def test_the_settings_tables_are_rendered_from_the_dataclass() -> None:
    table = settings_table()
    assert all(f"| `{name}` |" in table for name in EnvConfig.__dataclass_fields__)
    assert table in (inspect.getdoc(KernelDVFSEnv) or "")
    assert table in (REPO_ROOT / "docs/design/environment.md").read_text(), \
        "docs/design/environment.md: paste kdvfs.envs.env.config.settings_table() into the Arguments section"
