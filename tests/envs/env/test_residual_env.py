"""``KernelDVFSResidual-v0``: residual actions over the fitting plan, observed as a controller measures."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from kdvfs.agents.learned.training.imitation import expert_action
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.measured import (
    MARGINS,
    RELEASE,
    Measurement,
    drift_factors,
    residual_observation,
    residual_pair,
)
from kdvfs.envs.env.residual_env import ZERO_ACTION, ResidualDVFSEnv
from kdvfs.envs.env.steps.step_data import StepData

SETTINGS = EnvConfig(plan_budgets=(0.0, 0.005, 0.01, 0.02), budgets=(0.005, 0.01, 0.02),
                     latency_scales=(0.0, 1.0, 2.0), decision_latencies=0.1)


def _episode(env: KernelDVFSEnv, act: object, options: dict[str, float]) -> dict[str, float]:
    env.reset(seed=0, options=options)
    done, info = False, {}
    while not done:
        _, _, done, _, info = env.step(act(env))  # type: ignore[operator]
    return info


def test_passes_gymnasium_and_sb3_checkers() -> None:
    env = ResidualDVFSEnv(gpu="h200", config=SETTINGS.with_disturbances().replace(residual_actions=True))
    check_env(env, skip_render_check=True)
    sb3_check_env(env)


@pytest.mark.parametrize("scale", [0.0, 1.0, 2.0])
def test_the_zero_action_is_the_fitting_plan_exactly(scale: float) -> None:
    """Measured without error (no disturbance, no drift error, an anchor at every kernel), the zero action runs
    the clocks the shipped expert (v0's fitting plan advisor) runs, kernel for kernel."""
    quiet = SETTINGS.without_disturbances()
    residual = ResidualDVFSEnv(gpu="h200", config=quiet.replace(residual_actions=True, drift_sd_pct=0.0,
                                                                 anchors_per_step=100_000))
    legacy = KernelDVFSEnv(gpu="h200", config=quiet)
    for budget in SETTINGS.budgets:
        options = {"budget": budget, "latency_scale": scale}
        mine = _episode(residual, lambda env: ZERO_ACTION, options)
        theirs = _episode(legacy, lambda env: expert_action(env, "fitting_plan"), options)
        np.testing.assert_array_equal(residual.applied, legacy.applied)
        assert mine["energy_saved_pct"] == theirs["energy_saved_pct"] and theirs["energy_saved_pct"] > 0


def test_a_residual_moves_the_clocks_off_the_plan() -> None:
    env = ResidualDVFSEnv(gpu="h200", config=SETTINGS.without_disturbances().replace(residual_actions=True))
    options = {"budget": 0.02, "latency_scale": 1.0}
    _episode(env, lambda e: ZERO_ACTION, options)
    planned = env.applied.copy()
    _episode(env, lambda e: np.array([2, 0, 0]), options)  # CORE_STEPS[2] = one level lower
    assert not np.array_equal(env.applied, planned)


def test_the_observation_is_the_measured_states_function() -> None:
    """The observation the environment returns is :func:`residual_observation` of the state it measured: the
    function a controller calls with its own measurements."""
    env = ResidualDVFSEnv(gpu="h200", config=SETTINGS.with_disturbances().replace(residual_actions=True))
    env.reset(seed=3, options={"budget": 0.01, "latency_scale": 1.0})
    for _ in range(3):
        observation, *_ = env.step(np.array([0, 0, 2]))
    state = env.measured_state()
    assert state.kernel > 0 and state.model_elapsed_s > 0
    out = np.zeros_like(observation)
    residual_observation(out, env.tables(), state, env.budget, env.budget_plan, 0.1, env.measurement.errors)
    np.testing.assert_array_equal(out, observation)


def test_the_measured_drift_applies_at_every_clock() -> None:
    """A controller cannot tell the step's own error from the limiter's drift, so it assumes no clock escapes
    what it measured."""
    np.testing.assert_allclose(drift_factors(5, 2.0), [1.02] * 5)


def test_residual_pairs_keep_auto_and_stay_on_the_grid() -> None:
    levels, memories = 5, 2
    assert residual_pair(1, 3, 0, levels, memories) == 1  # auto core stays auto; memory 1 stays
    assert residual_pair(2, 10, 1, levels, memories) == 9  # level 1 -> 4 (clipped), memory 0 -> 1
    assert residual_pair(8, -10, -1, levels, memories) == 2  # level 4 -> 1 (never auto), memory 0


def test_the_position_runs_through_the_clocks_seen_in_effect_since_the_anchor() -> None:
    """Kernels of 1 s at pair 0 and 2 s at pair 1; pair 1 lands at 1 s. At 3.5 s the GPU is a quarter into
    kernel 2 (1 kernel at pair 0, then 1.25 at pair 1), not 1.75 kernels in (all of it at pair 1's pace), and the
    prediction's time at the clocks run is the host time (no prediction error)."""
    cumulative = np.array([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0], [3.0, 6.0], [4.0, 8.0]])
    measurement = Measurement(cumulative, 0.0, np.array([0]), np.ones(2))
    measurement.landed(0.0, 0, 0.0)
    measurement.landed(1.0, 1, measurement.position(1, 0.0, 1.0))
    position = measurement.position(2, 0.0, 3.5)
    assert position == pytest.approx(2.25) and measurement.kernel(position) == 3
    assert measurement.model_elapsed(position) == pytest.approx(3.5)
    slower = Measurement(cumulative, 0.0, np.array([0]), np.ones(2), paces=np.array([2.0]))
    slower.landed(0.0, 0, 0.0)
    assert slower.position(1, 0.0, 1.0) == pytest.approx(0.5)  # the step measured at twice the prediction's time


def test_a_drift_measured_with_its_error_keeps_the_fitting_plan_within_budget_at_ideal_switching() -> None:
    """Only the drift's measurement error (no other disturbance): the position a hair past each kernel's start
    once put every change one kernel late and booked the kernel at the wrong clocks as prediction error (4.7%
    slowdown at a 1% budget on a held-out GPT-2 step); now the zero action overruns by no more than the drift's
    error (the auto time it believes in)."""
    env = ResidualDVFSEnv(gpu="h200", config=SETTINGS.without_disturbances().replace(residual_actions=True))
    for seed in range(3):
        env.reset(seed=seed, options={"budget": 0.01, "latency_scale": 0.0})
        done, info = False, {}
        while not done:
            _, _, done, _, info = env.step(ZERO_ACTION)
        error_pct = abs(env._measured_drift_pct)  # the true drift is 0
        assert error_pct > 0.0 and info["slowdown_pct"] <= 1.0 + 1.1 * error_pct


def _slower(step: StepData, factor: float) -> StepData:
    """``step`` with every kernel's time at every pair ``factor`` times the prediction's."""
    time_s = step.time_s * factor
    cumulative = np.zeros_like(step.cumulative)
    cumulative[1:, 0] = np.cumsum(time_s, axis=0)
    cumulative[1:, 1] = np.cumsum(step.energy_j, axis=0)
    return StepData(step.name, step.grid, step.actions, time_s, step.energy_j, step.idle_power_w, step.features,
                    cumulative)


def test_the_measured_drift_is_autos_step_time_over_the_predictions() -> None:
    """A controller's A windows measure auto's step time over the prediction's (the runtime's auto scale): an
    executed step 10% slower than predicted at every clock reads as a 10% drift, with no true drift and no
    measurement error, and the pace between anchors, relative to that, as 1."""
    config = SETTINGS.without_disturbances().replace(residual_actions=True, drift_sd_pct=0.0)
    env = ResidualDVFSEnv(gpu="h200", config=config)
    env.reset(seed=0, options={"budget": 0.01, "latency_scale": 1.0})
    assert env.measured_state().drift_pct == 0.0
    env.reset(seed=0, options={"step": 0, "budget": 0.01, "latency_scale": 1.0,
                           "executed": _slower(env.steps[0], 1.1)})
    assert env.measured_state().drift_pct == pytest.approx(10.0)
    np.testing.assert_allclose(env.measurement.paces, 1.0)


@pytest.mark.parametrize("scale", [0.0, 1.0])
def test_release_runs_auto_from_the_step_start_and_is_never_over_budget(scale: float) -> None:
    """The release, chosen first, runs the whole step at auto with every disturbance on: no saving, no
    slowdown, within even a 0% budget, in one decision; the margin at index 0 on the same episode saves."""
    config = SETTINGS.with_disturbances().replace(residual_actions=True, budgets=(0.0, 0.01))
    env = ResidualDVFSEnv(gpu="h200", config=config)
    for seed in range(3):
        env.reset(seed=seed, options={"budget": 0.0, "latency_scale": scale})
        _, _, done, _, info = env.step(np.array([3, 1, RELEASE]))  # residuals ignored under a release
        assert done and (env.applied == env._data.actions[0]).all() and env._requests == 0
        assert info["slowdown_pct"] == pytest.approx(0.0, abs=1e-9) and info["violation"] == 0.0
        assert info["energy_saved_pct"] == pytest.approx(0.0, abs=1e-9)
    planned = _episode(env, lambda e: ZERO_ACTION, {"budget": 0.01, "latency_scale": scale})
    assert planned["energy_saved_pct"] > 0


def test_release_mid_step_requests_auto_once_and_nothing_after() -> None:
    """Released while the plan's locked clocks run: one request back to auto, then auto to the step's end."""
    env = ResidualDVFSEnv(gpu="h200", config=SETTINGS.without_disturbances().replace(residual_actions=True))
    env.reset(seed=0, options={"budget": 0.02, "latency_scale": 1.0})
    env.step(ZERO_ACTION)
    released_at, requests = env._k, env._requests
    assert env._in_effect != 0 and env.applied[:released_at].any()
    _, _, done, _, info = env.step(np.array([0, 0, RELEASE]))
    assert done and env._requests == requests + 1 and env.applied[-1] == env._data.actions[0]
    assert info["energy_saved_pct"] > 0  # the stretch before the release saved


def test_environments_over_the_same_steps_share_one_copy_of_each_steps_tables() -> None:
    """The live tables (landings for every pair) are built once per process, step and regime, not once per
    environment: each environment of a vectorised training run holding its own copy grew to 7 GB a process."""
    config = SETTINGS.with_disturbances().replace(residual_actions=True, run_steps=2)
    first = ResidualDVFSEnv(gpu="h200", config=config)
    second = ResidualDVFSEnv(first.steps, gpu="h200", config=config)  # as a vectorised run's: the same steps
    for env in (first, second):
        env.reset(seed=0, options={"budget": 0.01, "latency_scale": 1.0})
    mine, theirs = first.tables(), second.tables()
    assert mine.landings is theirs.landings and mine.change_kernels is theirs.change_kernels
    assert mine.obs is not theirs.obs and mine.advice is not theirs.advice  # each writes its own buffers
    first.reset(seed=0, options={"budget": 0.01, "latency_scale": 2.0})
    assert first.tables().landings is not mine.landings


@pytest.mark.parametrize("scale", [0.0, 1.0])
def test_a_margin_holds_its_share_of_the_budget_however_often_the_plan_decides(scale: float) -> None:
    """Measured without error, the fitting plan with half the budget held back slows the step by at most half the
    budget, at ideal switching (a decision at almost every segment) as at the profile's latency: the margin is a
    share of the step's budget, not of the slack left at each decision (which every decision gave back)."""
    quiet = SETTINGS.without_disturbances().replace(residual_actions=True, drift_sd_pct=0.0, anchors_per_step=100_000)
    env = ResidualDVFSEnv(gpu="h200", config=quiet)
    half = np.array([0, 0, MARGINS.index(0.5)])
    held_pct = []
    for budget in SETTINGS.budgets:
        options = {"budget": budget, "latency_scale": scale}
        held_pct.append(_episode(env, lambda e: half, options)["slowdown_pct"])
        spent_pct = _episode(env, lambda e: ZERO_ACTION, options)["slowdown_pct"]
        assert held_pct[-1] <= 50.0 * budget + 1e-6 < spent_pct
    assert max(held_pct) > 0.0  # the held plan still spends
