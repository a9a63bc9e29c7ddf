"""``Landings``: each pair's landing kernels and each plan's proposal changes on first use, and all of them as
the packed tables a live decision reads."""

from __future__ import annotations

import numpy as np

from kdvfs.envs.env.advice.landings import Landings
from kdvfs.envs.env.advice.plan_advice import landing_kernels
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.timing import decision_data


def _landings() -> tuple[Landings, KernelDVFSEnv]:
    env = KernelDVFSEnv(gpu="h200", config=EnvConfig().without_disturbances(),
                        plan_budgets=(0.0, 0.005, 0.01, 0.02), decision_latencies=0.1)
    env.reset(seed=0)
    step = env.steps[0].repeated(env.config.run_steps)
    _, plans = decision_data(step, env.observation_spec, env.timing)
    return Landings(step, plans, env.latency_s, env.latency_std_s, env.decision_interval_s), env


def test_each_pair_lands_where_its_timeline_says() -> None:
    found, env = _landings()
    step = env.steps[0].repeated(env.config.run_steps)
    for pair in (0, 1, env.grid.size - 1):
        expected = landing_kernels(step.cumulative_of(pair)[0], env.latency_s, env.latency_std_s,
                                   env.decision_interval_s)
        assert all(np.array_equal(a, b) for a, b in zip(found.of(pair), expected, strict=True))
        assert all(np.shares_memory(a, found.rows[pair]) for a in found.of(pair))  # computed once, into its row


def test_the_table_packs_every_pairs_landings_and_every_plans_proposal_changes() -> None:
    """The table's proposal changes (every plan's from one pass over a pair's advice) are those each plan's own
    first use computes (another Landings, not tabled)."""
    found, env = _landings()
    lazy, _ = _landings()
    table, offsets, kernels = found.table()
    pairs, plans = env.grid.size, len(env.observation_spec.plan_budgets)
    assert table.shape == (pairs, 2, env.steps[0].kernels * env.config.run_steps + 1)
    assert offsets.shape == (pairs * plans + 1,) and offsets[0] == 0 and offsets[-1] == len(kernels)
    for pair in range(pairs):
        assert np.array_equal(table[pair], np.array(found.of(pair)))
        for plan in range(plans):
            changes = kernels[offsets[pair * plans + plan]:offsets[pair * plans + plan + 1]]
            assert np.array_equal(changes, lazy.proposal_changes(pair, plan))
            assert np.all(np.diff(changes) > 0)
    assert len(kernels) > 0
