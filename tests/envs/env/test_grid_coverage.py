"""``every_core_clock``: the clock grid holds every pair the best static plan and the latency-aware optimum
choose on H200 training and held-out steps (the shipped fractions miss e.g. 1695 MHz on gpt3xl-1layer-b4)."""

from __future__ import annotations

import numpy as np
import pytest

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.training.ppo import load_train_config
from kdvfs.agents.planners.registry import make_planner
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.synthetic.generator import generate_transformer_trace, load_workload
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.trace import Trace

PROFILE = load_profile("h200")
CONFIG = load_train_config("h200").env


def _pairs(trace: Trace, budget: float) -> set[str]:
    problem = Problem.build(trace, PROFILE, budget)
    return {problem.costs.label(int(a)) for method in ("static", "latency-optimal")
            for a in np.unique(make_planner(method).plan(problem).actions)}


def _labels(every_core_clock: bool) -> set[str]:
    grid = CONFIG.replace(every_core_clock=every_core_clock).grid(PROFILE)
    return {grid.label(g) for g in range(grid.size)}


def test_every_core_clock_fills_the_range_in_the_profiles_steps() -> None:
    grid = CONFIG.replace(every_core_clock=True).grid(PROFILE)
    cores = [level[0] for level in grid.core_mhz[1:]]
    assert cores[0] == 1980 and cores[-1] == 1185 and set(np.diff(cores)) == {-15}
    assert grid.core_mhz[0] == (None, None)
    assert CONFIG.replace(every_core_clock=False).core_levels(PROFILE) == CONFIG.core_fractions == (1.0, 0.6)


@pytest.mark.parametrize(("name", "budget"), [("h200/gpt3xl-1layer-b4", 0.01),
                                              ("h200/gpt3xl-1layer-b4", 0.02), ("bert-base", 0.01), ("gpt2m", 0.01)])
def test_the_planners_pairs_are_on_the_grid(name: str, budget: float) -> None:
    trace = open_trace(name) if "/" in name else generate_transformer_trace(load_workload(name), PROFILE)
    used = _pairs(trace, budget)
    assert used <= _labels(True)
    assert not used <= _labels(False)  # the two fractions alone miss them
