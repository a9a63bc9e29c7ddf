"""PPO training: strict configs, the train/held-out split, and a short smoke run with everything it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kdvfs.agents.learned.policy.frozen import FrozenPolicy
from kdvfs.agents.learned.training.ppo import PPO_CONFIG_DIR, load_train_config, train_config_mapping
from kdvfs.agents.learned.training.train import TrainResult
from kdvfs.common.config import ConfigError, to_plain
from kdvfs.envs.env.steps.workloads import DataSplit, Variants, WorkloadSet
from kdvfs.envs.gpu.profiles import load_profile


@pytest.mark.parametrize("gpu", ["h200", "rtx3080ti"])
def test_shipped_configs_load_and_keep_held_out_families_out_of_training(gpu: str) -> None:
    config = load_train_config(gpu)
    assert config.gpu == gpu
    assert not config.data.train.families() & set(config.data.held_out_families)
    assert config.data.held_out.families() <= set(config.data.held_out_families)


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    raw = train_config_mapping("h200")
    raw["ppo"]["learning_rate_typo"] = 1.0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="learning_rate_typo"):
        load_train_config(path)


def test_a_gpu_without_a_config_lists_the_bundled_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown PPO config 'gtx1080ti'; known: a100-sxm4, b200, h100-sxm, h200, "
                                          r"residual-a100-sxm4, residual-b200, residual-h200, rtx3080ti .*--config"):
        load_train_config("gtx1080ti")


RESOLVED = Path(__file__).parent / "fixtures" / "ppo_resolved.json"
"""Every GPU's resolved config as the whole per-GPU files gave it before they were split into
``default.yaml`` plus overrides."""


@pytest.mark.parametrize("gpu", ["h200", "b200", "h100-sxm", "a100-sxm4", "rtx3080ti"])
def test_each_gpus_config_resolves_as_before_the_default_and_overrides_split(gpu: str) -> None:
    assert to_plain(load_train_config(gpu)) == json.loads(RESOLVED.read_text())[gpu]
    assert to_plain(load_train_config(PPO_CONFIG_DIR / f"{gpu}.yaml")) == to_plain(load_train_config(gpu))


def test_extends_merges_mappings_and_replaces_everything_else(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("extends: h200\nseed: 3\nenv: {memory_mhz: [3201]}\n")
    (tmp_path / "mine.yaml").write_text("extends: base.yaml\nimitation: {epochs: 2}\n"
                                        "env: {core_fractions: [1.0, 0.8]}\n")
    config, h200 = load_train_config(tmp_path / "mine.yaml"), load_train_config("h200")
    assert (config.gpu, config.seed, config.imitation.epochs, config.imitation.batch_size) == \
        ("h200", 3, 2, h200.imitation.batch_size)
    assert (config.env.core_fractions, config.env.memory_mhz) == ((1.0, 0.8), (3201,))
    assert config.env.budgets == h200.env.budgets and config.data == h200.data
    (tmp_path / "typo.yaml").write_text("extends: h200\nimitation: {epoch: 2}\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: imitation: unknown key\(s\) \['epoch'\]"):
        load_train_config(tmp_path / "typo.yaml")


def test_bad_extends_are_errors(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\ngpu: h200\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_train_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: gtx1080ti\n")
    with pytest.raises(ConfigError, match="no bundled PPO config 'gtx1080ti'"):
        load_train_config(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="not a config by itself"):
        load_train_config("default")


def test_a_split_that_trains_on_a_held_out_family_is_refused() -> None:
    with pytest.raises(ConfigError, match="gpt2s"):
        DataSplit(train=WorkloadSet(presets=("gpt2s",)), held_out=WorkloadSet(), held_out_families=("gpt2s",))
    with pytest.raises(ConfigError, match="resnet50"):
        DataSplit(train=WorkloadSet(), held_out=WorkloadSet(bundled=("h200/resnet50-b128",)), held_out_families=())
    with pytest.raises(ConfigError, match="validation set uses held-out families"):
        DataSplit(train=WorkloadSet(), held_out=WorkloadSet(presets=("gpt2s",)), held_out_families=("gpt2s",),
                  validation=WorkloadSet(presets=("gpt2s",)))


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
    assert "held_out" not in summary  # nothing held out is scored while training
    assert summary["git_revision"] == record["git_revision"]
    assert summary["selected"] == tiny_run.selected and summary["multipliers"] is None  # no constraint by default


def test_the_default_config_trains_the_design_the_runtime_runs() -> None:
    """``kdvfs train --gpu <gpu>`` trains the plan-choice design (``KernelDVFS-v0``) that ``kdvfs run`` runs
    online; the residual design is opt-in (``configs/ppo/residual-<gpu>.yaml``)."""
    for gpu in ("h200", "b200", "h100-sxm", "a100-sxm4", "rtx3080ti"):
        env = load_train_config(gpu).env
        assert not env.residual_actions and load_train_config(gpu).constraint is None
    for gpu in ("h200", "b200", "a100-sxm4"):
        residual = load_train_config(f"residual-{gpu}")
        assert residual.gpu == gpu and residual.env.residual_actions and residual.constraint is not None


def test_a_runs_saved_config_is_whole_and_loads_back(tiny_run: TrainResult) -> None:
    saved = tiny_run.out / "config.yaml"
    assert "extends" not in yaml.safe_load(saved.read_text())
    assert to_plain(load_train_config(saved)) == yaml.safe_load(saved.read_text())


def test_ppo_ships_only_when_its_paired_interval_over_the_clone_is_above_zero(tiny_run: TrainResult) -> None:
    summary = json.loads((tiny_run.out / "summary.json").read_text())
    comparison, selected = summary["selection_comparison"], summary["selected"]
    assert summary["validation_steps"] == [f"gpt2m-L4-b8-s{s}" for s in (256, 512, 1024)]  # not the training steps
    low, high = comparison["ci95"]
    assert low <= comparison["delta_return"] <= high and comparison["pairs"] > 1
    assert selected == ("ppo" if low > 0 else "imitation")
    policy = FrozenPolicy.load(tiny_run.policy_path, load_profile("h200"))
    assert policy.meta["selected"] == selected and policy.meta["selection_comparison"] == comparison


def test_residual_ppo_ships_only_when_it_beats_the_fixed_margin_plans_on_validation(
        tiny_residual_run: TrainResult) -> None:
    tiny_run = tiny_residual_run
    summary = json.loads((tiny_run.out / "summary.json").read_text())
    env = load_train_config("residual-h200").env
    assert set(summary["multipliers"]) == {f"{b}/{s}" for b in env.budgets for s in env.latency_scales}
    comparison, selected = summary["selection_comparison"], summary["selected"]
    assert summary["validation_steps"] == [f"gpt2m-L4-b8-s{s}" for s in (256, 512, 1024)]  # not the training steps
    low, high = comparison["ci95"]
    assert low <= comparison["delta_saved_pct"] <= high
    beats = comparison["min_cell_within_budget_ppo"] >= 0.95 and low > 0
    assert min(map(min, comparison["cells_within_budget_ppo"])) == comparison["min_cell_within_budget_ppo"]
    assert set(summary["unheld_cells"]) <= set(summary["multipliers"]) >= set(summary["infeasible_cells"])
    assert comparison["beats_margin_plans"] == beats and selected == ("ppo" if beats else "imitation")
    policy = FrozenPolicy.load(tiny_run.policy_path, load_profile("h200"))
    assert policy.meta["selected"] == selected and policy.meta["selection_comparison"] == comparison

