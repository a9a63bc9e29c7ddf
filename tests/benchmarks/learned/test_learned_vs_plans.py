"""The held-out comparison's episodes run in a pool of processes are the episodes of one process."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from benchmarks.learned.learned_vs_plans import chunk_episodes, pooled_episodes
from kdvfs.agents.learned.training.ppo import load_train_config
from kdvfs.envs.env.steps.shape_pairs import ShapeSet
from kdvfs.envs.gpu.profiles import load_profile


@pytest.mark.slow
def test_pooled_episodes_are_the_serial_ones() -> None:
    config = load_train_config("residual-h200").env
    pairs = ShapeSet(("gpt2m",), 1, (1.0,), (256, 512, 1024), references=2, variants=2).pairs(
        load_profile("h200"), config.grid(load_profile("h200")))
    serial = chunk_episodes("h200", "plans", pairs, config, 1)
    with ProcessPoolExecutor(2) as pool:
        pooled = pooled_episodes(pool, "h200", "plans", pairs, config, 1)
    assert serial.shape[1] == len(pairs) and np.array_equal(serial, pooled)
