"""PPO training: strict configs, the train/held-out split, and a short smoke run with everything it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.ppo import PPO_CONFIG_DIR, load_train_config
from kdvfs.agents.learned.train import TrainResult
from kdvfs.envs.common.config import ConfigError
from kdvfs.envs.env.workloads import DataSplit, Variants, WorkloadSet
from kdvfs.envs.gpu.profiles import load_profile


@pytest.mark.parametrize("gpu", ["h200", "rtx3080ti"])
def test_shipped_configs_load_and_keep_held_out_families_out_of_training(gpu: str) -> None:
    config = load_train_config(gpu)
    assert config.gpu == gpu
    assert not config.data.train.families() & set(config.data.held_out_families)
    assert config.data.held_out.families() <= set(config.data.held_out_families)


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    raw = yaml.safe_load((PPO_CONFIG_DIR / "h200.yaml").read_text())
    raw["ppo"]["learning_rate_typo"] = 1.0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="learning_rate_typo"):
        load_train_config(path)


def test_a_gpu_without_a_config_lists_the_bundled_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown PPO config 'gtx1080ti'; known: a100-sxm4, b200, h100-sxm, h200, "
                                          r"rtx3080ti .*--config"):
        load_train_config("gtx1080ti")


def test_a_split_that_trains_on_a_held_out_family_is_refused() -> None:
    with pytest.raises(ConfigError, match="gpt2s"):
        DataSplit(train=WorkloadSet(presets=("gpt2s",)), held_out=WorkloadSet(), held_out_families=("gpt2s",))
    with pytest.raises(ConfigError, match="resnet50"):
        DataSplit(train=WorkloadSet(), held_out=WorkloadSet(bundled=("h200/resnet50-b128",)), held_out_families=())


def test_variants_are_seeded_and_named() -> None:
    variants = Variants(("gpt2m",), (2, 4), (0.5, 1.0), (512,), ("bf16", "fp32"), (True, False), 3, seed=1)
    names = [c.name for c in variants.configs()]
    assert names == [c.name for c in variants.configs()] and len(set(names)) == 3
    assert all(name.startswith("gpt2m-L") for name in names)


def test_smoke_run_writes_policy_logs_checkpoints_and_record(tiny_run: TrainResult) -> None:
    out = tiny_run.out
    assert tiny_run.timesteps >= 256 and tiny_run.policy_path.is_file()
    record = json.loads((out / "run.json").read_text())
    assert record["seed"] == 0 and record["git_revision"] and record["config"]["gpu"] == "h200"
    assert yaml.safe_load((out / "config.yaml").read_text())["total_timesteps"] == 256
    assert list((out / "tensorboard").rglob("events.out.tfevents*"))
    assert list((out / "checkpoints").glob("ppo_*_steps.zip"))
    assert (out / "model.zip").is_file() and (out / "vecnormalize.pkl").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["held_out"]) == {"h200/gpt2s-b16"}
    assert set(tiny_run.held_out["h200/gpt2s-b16"]) >= {"energy_saved_pct", "slowdown_pct", "switches"}


def test_the_shipped_policy_is_the_better_of_clone_and_ppo_on_the_training_steps(tiny_run: TrainResult) -> None:
    summary = json.loads((tiny_run.out / "summary.json").read_text())
    scores, selected = summary["training_scores"], summary["selected"]
    assert set(scores) == {"imitation", "ppo"}
    assert selected == ("ppo" if scores["ppo"] >= scores["imitation"] else "imitation")
    policy = FrozenPolicy.load(tiny_run.policy_path, load_profile("h200"))
    assert policy.meta["selected"] == selected and policy.meta["training_scores"] == scores
