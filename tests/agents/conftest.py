"""Tiny PPO runs shared by the PPO and frozen-policy tests (each trained once per session): the default design
(``tiny_run``) and the experimental residual one (``tiny_residual_run``)."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from kdvfs.agents.learned.training.ppo import NetArch, PolicyKwargs, TrainConfig, load_train_config
from kdvfs.agents.learned.training.train import TrainResult, train
from kdvfs.envs.env.steps.shape_pairs import ShapeSet
from kdvfs.envs.env.steps.workloads import WorkloadSet
from tests.made_once import made_once


def tiny_config(name: str = "h200") -> TrainConfig:
    """The H200 config ``name`` cut down: one small training step, one held-out step, a 16x16 MLP, 256
    timesteps."""
    config = load_train_config(name)
    ppo = replace(config.ppo, n_steps=64, batch_size=64, n_epochs=1,
                  policy_kwargs=PolicyKwargs(NetArch((16, 16), (16, 16))))
    data = replace(config.data, train=WorkloadSet(bundled=("h200/gpt3xl-1layer-b4",)),
                   held_out=WorkloadSet(bundled=("h200/gpt2s-b16",)),
                   validation=WorkloadSet(shapes=ShapeSet(("gpt2m",), 4, (1.0,), (256, 512, 1024), references=2,
                                                          variants=2)))
    return replace(config, total_timesteps=256, n_envs=2, checkpoint_every=128, eval_every=128, ppo=ppo, data=data)


def _train_tiny(folder: Path) -> None:
    result = train(tiny_config(), folder / "run")
    (folder / "result.pickle").write_bytes(pickle.dumps(result))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The tiny run, trained once per session (all pytest-xdist workers); tests read its folder."""
    result = pickle.loads((made_once(tmp_path_factory, "ppo", _train_tiny) / "result.pickle").read_bytes())
    assert isinstance(result, TrainResult)
    return result


def _train_tiny_residual(folder: Path) -> None:
    result = train(tiny_config("residual-h200"), folder / "run")
    (folder / "result.pickle").write_bytes(pickle.dumps(result))


@pytest.fixture(scope="session")
def tiny_residual_run(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """The tiny run of the experimental residual design, trained once per session (all pytest-xdist workers)."""
    folder = made_once(tmp_path_factory, "residual", _train_tiny_residual)
    result = pickle.loads((folder / "result.pickle").read_bytes())
    assert isinstance(result, TrainResult)
    return result
