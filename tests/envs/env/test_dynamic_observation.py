"""The compiled dynamic observation against a plain numpy reference (the environment's rules written out
entry by entry), bit for bit, at random live states; and the environment's observation built from it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdvfs.agents.common.problem import Problem
from kdvfs.envs.env.advice.plan_advice import PlanAdvice, landing_kernels, plan_for_budget
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.dynamic_observation import clock_one_hots, layout, observe_dynamic
from kdvfs.envs.env.observing.live import LiveState
from kdvfs.envs.env.observing.observation import (
    ADVISOR_FEATURES,
    OBS_LIMIT,
    REMAINING_LATENCIES_CAP,
    ObservationSpec,
    advisor_index,
)
from kdvfs.envs.env.steps.clock_grid import ClockGrid
from kdvfs.envs.env.steps.step_data import StepData
from kdvfs.envs.env.timing import decision_data
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.trace.bundled import open_trace
from tests.envs.env.env_doubles import FINE_CORE_FRACTIONS, PREVIOUS, observe_state

BUDGET, PLAN_BUDGETS = 0.01, (0.0, 0.005, 0.01, 0.02)


def _clip(value: float) -> float:
    return min(OBS_LIMIT, max(-OBS_LIMIT, value))


class Setting:
    """One env's step, spec and plans, and the compiled kernel's inputs for a live state."""

    def __init__(self) -> None:
        profile = load_profile("h200")
        problem = Problem.build(open_trace("h200/gpt3xl-1layer-b4"), profile, BUDGET)
        grid = ClockGrid.for_profile(profile, FINE_CORE_FRACTIONS)
        step = StepData.from_costs("layer", problem.trace, problem.costs, grid)
        self.env = KernelDVFSEnv([step], profile, PREVIOUS, budgets=(BUDGET,), plan_budgets=PLAN_BUDGETS)
        self.env.reset(seed=0, options={"budget": BUDGET})
        self.spec: ObservationSpec = self.env.observation_spec
        self.timing = self.env.timings[0]
        self.static, self.plans = decision_data(step.repeated(1), self.spec, self.timing)
        self.cumulative_s = step.cumulative[:, 0, :]
        self.latency_s, self.stall_s = self.timing.switching[0], self.timing.switching[2]
        self.budget_plan = plan_for_budget(PLAN_BUDGETS, BUDGET)

    def landings(self, pair: int) -> tuple[np.ndarray, np.ndarray]:
        return landing_kernels(self.cumulative_s[:, pair], self.latency_s, self.timing.switching[1],
                               self.timing.decision_interval_s)

    def compiled(self, state: LiveState) -> tuple[np.ndarray, np.ndarray]:
        obs, advice = np.zeros(self.spec.size, dtype=np.float32), np.zeros(self.spec.advisors, dtype=np.int64)
        plans = self.plans
        observe_dynamic(obs, advice, self.static[state.kernel], layout(self.spec, len(self.cumulative_s) - 1),
                        advisor_index(self.spec), self.cumulative_s, *self.landings(state.in_effect), plans.pairs,
                        plans.rest_pct, plans.joinable, plans.next_change, plans.speeds_up, state.kernel,
                        state.in_effect, state.pending, self.latency_s - state.pending_age_s, state.elapsed_s,
                        state.auto_elapsed_s, state.model_elapsed_s, state.last_latency_ratio, state.auto_drift_pct,
                        BUDGET,
                        float(self.cumulative_s[-1, 0]), self.latency_s, self.stall_s, self.budget_plan)
        return obs[self.spec.static_size:], advice

    def reference(self, state: LiveState) -> tuple[np.ndarray, np.ndarray]:
        """The dynamic blocks written out with numpy, block by block."""
        spec, k, pair = self.spec, state.kernel, state.in_effect
        obs, advice = np.zeros(spec.size, dtype=np.float32), np.zeros(spec.advisors, dtype=np.int64)
        view = {name: spec.view(obs, name) for name, _ in spec.blocks()}
        grid, total, latency_s = spec.grid, float(self.cumulative_s[-1, 0]), self.latency_s
        for name, action in (("clocks_in_effect", pair), ("clocks_pending", state.pending)):
            if action >= 0:
                view[name][action // len(grid.memory_mhz)] = 1.0
                view[name][grid.levels + action % len(grid.memory_mhz)] = 1.0
        pending = state.pending >= 0
        view["controller"][:] = (max(0.0, latency_s - state.pending_age_s) / latency_s if pending else 0.0,
                                 0.0 if pending else 1.0, 1.0 if k == 0 else 0.0)
        run_pct = 100.0 * (state.elapsed_s / state.auto_elapsed_s - 1.0) if state.auto_elapsed_s > 0 else 0.0
        scale = state.elapsed_s / state.model_elapsed_s if state.model_elapsed_s > 0 else 1.0
        view["conditions"][:] = (1e3 * latency_s, state.auto_drift_pct, _clip(run_pct), state.last_latency_ratio,
                                 _clip(100.0 * (scale - 1.0)))
        expected = float(self.cumulative_s[k, 0])
        used_s, remaining = state.elapsed_s - state.auto_elapsed_s * scale, total - expected
        affordable = 100.0 * (BUDGET * total - used_s) / max(remaining, 1e-6 * total)
        view["budget"][:] = (100.0 * BUDGET, _clip(used_s / (BUDGET * total)), _clip(affordable), expected / total,
                             min(remaining / latency_s, REMAINING_LATENCIES_CAP) / REMAINING_LATENCIES_CAP)
        self._window_advisors(obs, advice, k, pair, affordable, view)
        self._plan_advisors(advice, k, pair, used_s, total, view)
        return obs[spec.static_size:], advice

    def _window_advisors(self, obs: np.ndarray, advice: np.ndarray, k: int, pair: int, affordable: float,
                         view: dict[str, np.ndarray]) -> None:
        windows = self.spec.view(self.static[k], "window_slowdown_then_saving_pct")
        slots, flat = self.spec.advisor_slots()["windows"], self.static[k][self.spec.span(
            "window_slowdown_then_saving_pct")]
        for w in range(windows.shape[1]):
            fits = windows[0, w] <= np.float32(max(affordable, 0.0))
            best = int(np.argmax(np.where(fits, windows[1, w], -np.inf)))
            advice[slots.start + w] = best
            index = advisor_index(self.spec)[:, w] + best
            view["advisors"][: len(ADVISOR_FEATURES) - 1, w] = flat[index]
            view["advisors"][-1, w] = float(best == pair)

    def _plan_advisors(self, advice: np.ndarray, k: int, pair: int, used_s: float, total: float,
                       view: dict[str, np.ndarray]) -> None:
        plans: PlanAdvice = self.plans
        effect, next_effect = (int(a[k]) for a in self.landings(pair))
        pairs = plans.advice_pairs(effect, next_effect)
        slots = self.spec.advisor_slots()
        advice[slots["plans"]] = pairs
        view["plans_in_effect"][:] = pairs == pair
        rest = view["plans_rest_saving_then_slowdown_pct"]
        rest[:] = plans.rest_pct[effect].reshape(rest.shape)
        auto_at_effect = float(self.cumulative_s[effect, 0])
        used_then_s = used_s + float(self.cumulative_s[effect, pair] - self.cumulative_s[k, pair]) \
            - (auto_at_effect - float(self.cumulative_s[k, 0]))
        rest_s = max(total - auto_at_effect, 1e-6 * total)
        affordable = 100.0 * (BUDGET * total - used_then_s) / rest_s
        join_stall_s = 0.0 if k == 0 else self.stall_s  # joining a plan after the first decision stalls the GPU
        limits = np.where(pairs == pair, np.float32(max(affordable, 0.0)),
                          np.float32(max(affordable - 100.0 * join_stall_s / rest_s, 0.0)))
        fits = (rest[1] <= limits) & ((pairs == pair) | plans.joinable[effect])
        fitting = int(np.argmax(np.where(fits, rest[0], -np.inf))) if fits.any() else -1
        for name, plan in (("fitting_plan", fitting), ("budget_plan", self.budget_plan)):
            slot = slots[name].start
            advice[slot] = 0 if plan < 0 else pairs[plan]
            view[name][:] = (0.0, 0.0, float(pair == 0), 0.0) if plan < 0 else \
                (rest[0, plan], rest[1, plan], float(pairs[plan] == pair), 1.0)


@pytest.fixture(scope="module")
def setting() -> Setting:
    return Setting()


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_compiled_dynamic_observation_equals_the_reference_bit_for_bit(setting: Setting, data: st.DataObject) -> None:
    kernels, pairs = len(setting.cumulative_s) - 1, setting.spec.grid.size
    k = data.draw(st.integers(0, kernels - 1))
    in_effect, pending = data.draw(st.integers(0, pairs - 1)), data.draw(st.integers(-1, pairs - 1))
    auto_s = float(setting.cumulative_s[k, 0])
    late = data.draw(st.floats(-0.05, 0.05, allow_nan=False))
    state = LiveState(k, in_effect, pending, data.draw(st.floats(0.0, 0.02)) if pending >= 0 else 0.0,
                      auto_s * (1 + late), auto_s, data.draw(st.floats(0.2, 3.0)), data.draw(st.floats(-5.0, 5.0)),
                      auto_s * data.draw(st.sampled_from((0.0, 0.97, 1.0, 1.03))))
    compiled, compiled_advice = setting.compiled(state)
    expected, expected_advice = setting.reference(state)
    assert np.array_equal(compiled, expected) and np.array_equal(compiled_advice, expected_advice)


def test_the_observation_is_the_static_row_then_the_compiled_part(setting: Setting) -> None:
    k = len(setting.cumulative_s) // 2
    auto_s = float(setting.cumulative_s[k, 0])
    state = LiveState(k, 3, -1, 0.0, auto_s * 1.004, auto_s)
    observation = observe_state(setting.env, state)
    assert np.array_equal(observation[: setting.spec.static_size], setting.static[k])
    assert np.array_equal(observation[setting.spec.static_size:], setting.compiled(state)[0])
    assert np.array_equal(setting.env.advice, setting.compiled(state)[1])


def test_the_clock_blocks_of_every_pair_are_those_the_observation_carries(setting: Setting) -> None:
    grid = setting.spec.grid
    blocks = clock_one_hots(grid.levels, len(grid.memory_mhz))
    auto_s = float(setting.cumulative_s[5, 0])
    for pair in range(grid.size):
        observation = observe_state(setting.env, LiveState(5, pair, pair - 1, 1e-3 if pair else 0.0, auto_s, auto_s))
        assert np.array_equal(setting.spec.view(observation, "clocks_in_effect"), blocks[pair + 1])
        assert np.array_equal(setting.spec.view(observation, "clocks_pending"), blocks[pair])  # pair - 1 pending
