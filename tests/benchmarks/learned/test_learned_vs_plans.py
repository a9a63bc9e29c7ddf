"""The held-out comparison's episodes run in a pool of processes are the episodes of one process."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from benchmarks.learned.learned_vs_plans import by_drift, chunk_episodes, pooled_episodes
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


def test_by_drift_splits_the_cases_at_the_median_drift_and_compares_within_each_half() -> None:
    pairs, budgets, latencies, noise = 4, 3, 3, 2
    strongest = np.zeros((pairs, budgets, latencies, noise, 3))
    strongest[..., 0] = 1.0
    strongest[..., 2] = np.arange(strongest[..., 2].size).reshape(strongest.shape[:-1]) % 2  # drift 0 or 1%
    ppo = np.repeat(strongest[None], 2, axis=0)
    ppo[..., 0] += np.where(strongest[..., 2] > 0.5, 2.0, -0.5)[None]  # ahead only where drift is high
    member = np.array([[True, True, False, False], [False, False, True, True]])
    below, above = by_drift(ppo, strongest, member, np.random.default_rng(0))
    assert below["episodes"] == above["episodes"] == strongest[..., 0].size // 2
    assert below["ppo_minus_strongest_plan_pct"] == pytest.approx(-0.5)
    assert above["ppo_minus_strongest_plan_pct"] == pytest.approx(2.0)
    assert above["saved_ppo_pct"] == pytest.approx(3.0) and below["saved_strongest_plan_pct"] == pytest.approx(1.0)
