"""The compiled residual observation (:func:`~kdvfs.envs.env.observing.residual_kernel.observe_residual`, behind
:func:`~kdvfs.envs.env.observing.measured.residual_observation`) against the Python observation it replaced,
kept here as the reference, bit for bit, at random measured states of a residual environment's step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.common.arrays import Array
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.observing.dynamic_observation import (
    L_BUDGET_PLAN,
    L_FITTING,
    L_FITTING_SLOT,
    L_LEVELS,
    L_MEMORIES,
    L_PLAN_SLOT,
    L_PLANS,
    L_PLANS_REST,
    observe_dynamic,
)
from kdvfs.envs.env.observing.live_tables import LiveTables
from kdvfs.envs.env.observing.measured import (
    ERROR_HISTORY,
    FEATURES,
    MARGINS,
    MeasuredState,
    budget_use,
    residual_observation,
    residual_pair,
)
from kdvfs.envs.env.observing.observation import OBS_LIMIT, PLAN_ADVISOR_FEATURES, REMAINING_LATENCIES_CAP
from kdvfs.envs.env.residual_env import ResidualDVFSEnv

SETTINGS = EnvConfig(plan_budgets=(0.0, 0.005, 0.01, 0.02), budgets=(0.005, 0.01, 0.02),
                     latency_scales=(0.0, 1.0, 2.0), decision_latencies=0.1)


def python_residual_observation(out: Array, tables: LiveTables, state: MeasuredState, budget: float,
                                budget_plan: int, margin: float, errors: Array) -> int:
    """The residual observation as Python computed it before it was compiled (the reference)."""
    sizes = tables.sizes
    lay = tables.layout
    kernels, plans = int(sizes[0]), int(lay[L_PLANS])
    levels, memories = int(lay[L_LEVELS]), int(lay[L_MEMORIES])
    k = min(max(state.kernel, 0), kernels - 1)
    scale = 1.0 + state.drift_pct / 100.0
    auto_s, step_s = state.auto_elapsed_s, tables.auto_time_s
    error = state.elapsed_s / state.model_elapsed_s - 1.0 if state.model_elapsed_s > 0 and state.elapsed_s > 0 \
        else 0.0
    used_s = state.elapsed_s - state.auto_elapsed_s * (1.0 + state.drift_pct / 100.0) * (1.0 + error)
    used_model_s = used_s / (scale * (1.0 + error))
    held_budget = budget * (1.0 - margin)
    obs, advice = tables.obs, tables.advice
    in_effect = state.in_effect
    observe_dynamic(obs, advice, tables.static_rows[k], lay, tables.advisor_index, tables.cumulative_s,
                    tables.landings[in_effect, 0], tables.landings[in_effect, 1], tables.plan_pairs, tables.plan_rest,
                    tables.joinable, tables.next_change, tables.speeds_up, k, in_effect, state.pending,
                    tables.latency_s - state.pending_age_s / scale, state.elapsed_s / scale, auto_s,
                    state.model_elapsed_s / scale, state.last_latency_ratio, state.drift_pct, held_budget, step_s,
                    tables.latency_s, tables.stall_s, budget_plan)
    fitting_start, budget_start = int(lay[L_FITTING]), int(lay[L_BUDGET_PLAN])
    fitting_pair = int(advice[int(lay[L_FITTING_SLOT])])
    remaining_s = step_s - auto_s
    affordable = 100.0 * (budget * step_s - used_model_s) / max(remaining_s, 1e-6 * step_s)
    effect = int(tables.landings[in_effect, 0, k])
    fitting_plan = -1
    if obs[fitting_start + PLAN_ADVISOR_FEATURES.index("exists")]:
        start = int(lay[L_PLAN_SLOT])
        found = np.flatnonzero(advice[start:start + plans] == fitting_pair)
        fitting_plan = int(found[0]) if len(found) else -1
    segment_end = int(tables.next_change[effect, fitting_plan]) if fitting_plan >= 0 else kernels
    segment_s = float(tables.cumulative_s[segment_end, fitting_pair] - tables.cumulative_s[effect, fitting_pair])
    latency_s = tables.latency_s
    level, memory = divmod(fitting_pair, memories)
    level_now, memory_now = divmod(in_effect, memories)
    values = [
        100.0 * budget, used_model_s / (max(budget, 1e-3) * step_s), affordable, auto_s / step_s,
        min(remaining_s / latency_s if latency_s > 0 else REMAINING_LATENCIES_CAP, REMAINING_LATENCIES_CAP)
        / REMAINING_LATENCIES_CAP,
        1e3 * latency_s, state.drift_pct, 100.0 * error, *errors, state.last_latency_ratio, margin,
        obs[fitting_start + 3], obs[fitting_start], obs[fitting_start + 1], level / max(levels - 1, 1),
        float(level == 0), memory / max(memories - 1, 1),
        min(segment_s / latency_s if latency_s > 0 else REMAINING_LATENCIES_CAP, REMAINING_LATENCIES_CAP)
        / REMAINING_LATENCIES_CAP,
        obs[budget_start + 1], level_now / max(levels - 1, 1), float(level_now == 0), memory_now / max(memories - 1, 1),
        float(state.pending >= 0),
    ]
    out[:len(FEATURES)] = np.clip(values, -OBS_LIMIT, OBS_LIMIT)
    rest = int(lay[L_PLANS_REST])
    out[len(FEATURES):] = obs[rest:rest + 2 * plans]
    return fitting_pair


@pytest.fixture(scope="module", params=[0.0, 1.0])
def env(request: pytest.FixtureRequest) -> ResidualDVFSEnv:
    """A residual environment's episode step, at no switching latency and at the profile's."""
    env = ResidualDVFSEnv(gpu="h200", config=SETTINGS.with_disturbances().replace(residual_actions=True))
    env.reset(seed=1, options={"budget": 0.01, "latency_scale": request.param})
    return env


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_compiled_observation_is_the_python_one_bit_for_bit(env: ResidualDVFSEnv, data: st.DataObject) -> None:
    tables = env.tables()
    cumulative_s, pairs = tables.cumulative_s, tables.cumulative_s.shape[1]
    kernels = len(cumulative_s) - 1
    k = data.draw(st.integers(-2, kernels + 2))
    auto_s = float(cumulative_s[min(max(k, 0), kernels), 0]) * data.draw(st.sampled_from((1.0, 0.999, 1.01)))
    pending = data.draw(st.integers(-1, pairs - 1))
    times = st.floats(0.0, 2.0, allow_nan=False)
    state = MeasuredState(k, data.draw(st.integers(0, pairs - 1)), pending,
                          data.draw(times) * 1e-3 if pending >= 0 else 0.0,
                          auto_s * data.draw(st.sampled_from((0.0, 0.9, 1.0, 1.004))) + data.draw(times) * 1e-4,
                          auto_s * data.draw(st.sampled_from((0.0, 0.97, 1.0, 1.03))), auto_s,
                          data.draw(st.floats(-5.0, 5.0)), data.draw(st.floats(0.2, 3.0)))
    budget = data.draw(st.sampled_from((0.0, 0.005, 0.01, 0.02, 0.05)))
    budget_plan = data.draw(st.integers(-1, len(SETTINGS.plan_budgets) - 1))
    margin = data.draw(st.sampled_from(MARGINS))
    errors = np.array(data.draw(st.lists(st.floats(-50.0, 50.0), min_size=ERROR_HISTORY, max_size=ERROR_HISTORY)))
    compiled, python = np.zeros(env.policy_spec.size, np.float32), np.full(env.policy_spec.size, np.nan, np.float32)
    try:  # a host time far below the prediction's (error -1) divides by zero, in Python as compiled
        expected = python_residual_observation(python, tables, state, budget, budget_plan, margin, errors)
    except ZeroDivisionError:
        with pytest.raises(ZeroDivisionError):
            residual_observation(compiled, tables, state, budget, budget_plan, margin, errors)
        return
    obs, advice = tables.obs.copy(), tables.advice.copy()
    assert residual_observation(compiled, tables, state, budget, budget_plan, margin, errors) == expected
    assert np.array_equal(compiled, python)
    assert np.array_equal(obs, tables.obs) and np.array_equal(advice, tables.advice)


def test_budget_use_and_residual_pairs_are_the_rules_written_out() -> None:
    state = MeasuredState(3, 0, -1, 0.0, 1.05, 1.0, 0.98, 2.0)
    error = 1.05 / 1.0 - 1.0
    assert budget_use(state) == (1.05 - 0.98 * (1.0 + 2.0 / 100.0) * (1.0 + error), error)
    assert budget_use(state._replace(model_elapsed_s=0.0)) == (1.05 - 0.98 * 1.02, 0.0)
    levels, memories = 5, 2
    for pair in range(levels * memories):
        for core_step in range(-5, 6):
            for memory_step in (-1, 0, 1):
                level, memory = divmod(pair, memories)
                if level > 0:
                    level = min(max(level + core_step, 1), levels - 1)
                memory = min(max(memory + memory_step, 0), memories - 1)
                assert residual_pair(pair, core_step, memory_step, levels, memories) == level * memories + memory
