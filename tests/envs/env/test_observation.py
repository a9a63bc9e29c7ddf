"""The observation spec's named blocks: they tile the vector, the environment writes them by name, and the
tables in the environment's docstring and docs/design/environment.md are rendered from them."""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest

from kdvfs.agents.learned.training.ppo import load_train_config
from kdvfs.common.paths import REPO_ROOT
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.observation import (
    BLOCKS,
    BUDGET_FEATURES,
    DIMENSIONS,
    ObservationSpec,
    observation_table,
    static_observations,
)
from kdvfs.envs.gpu.profiles import load_profile
from tests.envs.env.env_doubles import PREVIOUS, PairEnv


@pytest.fixture(scope="module")
def spec() -> ObservationSpec:
    """The shipped H200 config's layout."""
    config = load_train_config("h200").env
    return config.observation_spec(config.grid(load_profile("h200")))


def test_blocks_tile_the_vector_in_order(spec: ObservationSpec) -> None:
    assert set(spec.dimensions()) == set(DIMENSIONS)
    spans = [spec.span(block.name) for block in BLOCKS]
    assert spans[0].start == 0 and spans[-1].stop == spec.size == 1105
    assert all(a.stop == b.start for a, b in itertools.pairwise(spans))
    assert [name for name, _ in spec.blocks()] == [block.name for block in BLOCKS]
    assert spec.shape("window_slowdown_then_saving_pct") == (2, 4, 110) and spec.shape("clocks_in_effect") == (57,)
    buffer = np.zeros(spec.size, np.float32)
    assert all(np.shares_memory(spec.view(buffer, block.name), buffer) for block in BLOCKS if spec.shape(block.name))


def test_the_advisors_are_grouped_in_order(spec: ObservationSpec) -> None:
    slots = spec.advisor_slots()
    assert [(slots[g].start, slots[g].stop) for g in ("windows", "plans", "fitting_plan", "budget_plan")] \
        == [(0, 4), (4, 17), (17, 18), (18, 19)]
    assert spec.advisors == 19 and spec.plan_choices == 13 + 2


def test_the_env_writes_each_block_by_its_name() -> None:
    env = PairEnv(config=PREVIOUS, plan_budgets=(0.005, 0.01), latency_noise=False, duration_noise=0.0)
    spec, levels = env.observation_spec, env.grid.levels
    observation, _ = env.reset(seed=0, options={"budget": 0.01})
    target = 3 * len(env.grid.memory_mhz) + 1
    observation, *_ = env.step(np.array([0, 0]))
    observation, *_ = env.step(np.array([1, target]))
    k, in_effect, pending = env.clocks
    assert (in_effect, pending) == (0, target)
    static = static_observations(env.steps[0], spec, env.latency_s)[k]
    assert np.array_equal(observation[: spec.static_size], static)
    assert np.array_equal(spec.view(observation, "clocks_in_effect").nonzero()[0], [0, levels])
    assert np.array_equal(spec.view(observation, "clocks_pending").nonzero()[0], [3, levels + 1])
    budget = dict(zip(BUDGET_FEATURES, spec.view(observation, "budget"), strict=True))
    assert budget["budget_pct"] == pytest.approx(1.0) and 0.0 < budget["progress"] < 1.0
    assert spec.view(observation, "controller")[1] == 0.0  # the controller holds the request
    assert np.array_equal(spec.view(observation, "plans_in_effect"), env.advice[spec.advisor_slots()["plans"]] == 0)


def test_the_observation_tables_are_rendered_from_the_spec(spec: ObservationSpec) -> None:
    table = observation_table()
    assert all(f"| `{block.name}` | {block.size_text()} |" in table for block in BLOCKS)
    assert "| `window_slowdown_then_saving_pct` | 2 x 4 x 110 |" in observation_table(spec)
    assert table in (inspect.getdoc(KernelDVFSEnv) or "")
    assert table in (REPO_ROOT / "docs/design/environment.md").read_text(), \
        ("docs/design/environment.md: paste kdvfs.envs.env.observing.observation.observation_table() into the "
         "Observation space section")
