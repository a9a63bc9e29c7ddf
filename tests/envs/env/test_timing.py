"""Switching regimes drawn per episode (``latency_scales``) and the ``conditions`` block: latency, the auto
clock's drift, the run's measured slowdown, the last change's latency and the prediction error."""

from __future__ import annotations

import numpy as np
import pytest

from kdvfs.common.errors import KdvfsError
from kdvfs.envs.env.config import EnvConfig
from kdvfs.envs.env.dvfs_env import KernelDVFSEnv
from kdvfs.envs.env.observing.observation import BUDGET_FEATURES, CONDITION_FEATURES
from kdvfs.envs.env.timing import decision_data
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.schedule import switch_points
from kdvfs.envs.model.segment_plans import segments_ok
from tests.envs.env.env_doubles import PREVIOUS, PairEnv

PROFILE = load_profile("h200")


def _conditions(env: KernelDVFSEnv, observation: np.ndarray) -> dict[str, float]:
    return dict(zip(CONDITION_FEATURES, env.observation_spec.view(observation, "conditions"), strict=True))


def test_each_scale_runs_its_own_regime_and_the_observation_states_it() -> None:
    env = KernelDVFSEnv(config=PREVIOUS, latency_scales=(0.0, 1.0, 2.0), plan_budgets=(0.01,))
    mean_s, spread_s = PROFILE.switching.latency_mean_s, PROFILE.switching.latency_std_s
    for scale in (0.0, 1.0, 2.0):
        observation, _ = env.reset(seed=0, options={"latency_scale": scale})
        assert (env.latency_s, env.latency_std_s) == pytest.approx((scale * mean_s, scale * spread_s))
        assert env.stall_s == (0.0 if scale == 0 else PROFILE.cost_param("switch_stall_s"))
        assert env.decision_interval_s == pytest.approx(env.config.decision_latencies * scale * mean_s)
        assert _conditions(env, observation)["latency_ms"] == pytest.approx(1e3 * scale * mean_s)
    drawn = {env.reset(seed=seed)[0][env.observation_spec.span("conditions")][0] for seed in range(30)}
    assert len(drawn) == 3
    with pytest.raises(KdvfsError, match=r"latency_scale 3\.0 is not one of"):
        env.reset(options={"latency_scale": 3.0})
    with pytest.raises(KdvfsError, match="latency_scales"):
        KernelDVFSEnv(latency_scales=())


def test_the_drift_is_observed_and_auto_runs_measure_no_budget_use() -> None:
    env = KernelDVFSEnv(config=PREVIOUS, drift=True, duration_noise=0.0, run_steps=2)
    observation, _ = env.reset(seed=3)
    drawn = env.disturbances
    assert drawn.time_auto is not None and drawn.time_locked is not None
    expected = 100.0 * (drawn.time_auto / drawn.time_locked - 1.0)
    assert expected.min() > 0
    done, k = False, 0
    while not done:
        conditions = _conditions(env, observation)
        assert conditions["auto_drift_pct"] == pytest.approx(expected[k], rel=1e-5)
        # The drift rises along the run: elapsed over today's drift is the prediction's to within its rise.
        assert conditions["run_slowdown_pct"] == pytest.approx(0.0, abs=1e-3)
        assert conditions["prediction_error_pct"] == pytest.approx(0.0, abs=1e-3)
        budget = dict(zip(BUDGET_FEATURES, env.observation_spec.view(observation, "budget"), strict=True))
        assert budget["budget_used"] == pytest.approx(0.0, abs=1e-3)
        observation, _, done, _, _ = env.step(np.array([0, 0]))
        k = env.clocks[0]


def test_noise_the_prediction_does_not_know_is_prediction_error_not_budget_use() -> None:
    """A controller knows the prediction, not the executed step: at auto, the step's jitter and kernel noise
    are both its run slowdown and its prediction error, and the budget use (scaled by the error) stays 0."""
    env = KernelDVFSEnv(config=PREVIOUS, step_jitter=True, duration_noise=0.02)
    observation, _ = env.reset(seed=4)
    done, errors = False, []
    while not done:
        conditions = _conditions(env, observation)
        assert conditions["prediction_error_pct"] == pytest.approx(conditions["run_slowdown_pct"], abs=1e-4)
        budget = dict(zip(BUDGET_FEATURES, env.observation_spec.view(observation, "budget"), strict=True))
        assert budget["budget_used"] == pytest.approx(0.0, abs=1e-4)
        errors.append(conditions["prediction_error_pct"])
        observation, _, done, _, _ = env.step(np.array([0, 0]))
    assert max(abs(e) for e in errors[1:]) > 0.1


def test_the_prediction_error_is_elapsed_over_the_predictions_time_at_the_clocks_run() -> None:
    """Locked clocks slow the step as predicted: no prediction error, while the run slowdown shows it."""
    env = PairEnv(config=PREVIOUS, duration_noise=0.0, latency_scales=(0.0,))
    observation, _ = env.reset(seed=1)
    target = 12 * len(env.grid.memory_mhz)
    done = False
    while not done:
        observation, _, done, _, info = env.step(np.array([1, target]))
        conditions = _conditions(env, observation)
        assert conditions["prediction_error_pct"] == pytest.approx(0.0, abs=1e-3)
    assert conditions["run_slowdown_pct"] == pytest.approx(info["slowdown_pct"], rel=1e-4)
    assert info["slowdown_pct"] > 0.5


def test_the_last_latency_is_what_happened() -> None:
    env = PairEnv(config=PREVIOUS, latency_noise=True, duration_noise=0.02)
    observation, _ = env.reset(seed=1)
    assert _conditions(env, observation)["last_latency_ratio"] == 1.0
    target = 12 * len(env.grid.memory_mhz)
    observation, *_ = env.step(np.array([0, 0]))
    observation, *_ = env.step(np.array([1, target]))
    while env.clocks[1] != target:
        observation, *_ = env.step(np.array([0, 0]))
    # It took effect at the first kernel starting at least the drawn latency after the request.
    drawn_s, longest_s = env.disturbances.latency(0), float(env.steps[0].time_s.max()) * 1.1
    ratio = _conditions(env, observation)["last_latency_ratio"]
    assert drawn_s / env.latency_s - 1e-6 <= ratio <= (drawn_s + longest_s) / env.latency_s


def test_a_held_action_runs_the_clocks_of_issuing_it_at_every_decision_point() -> None:
    settings = {"plan_budgets": (0.005, 0.01, 0.02), "drift": True}
    every = KernelDVFSEnv(config=PREVIOUS, **settings)  # type: ignore[arg-type]
    held = KernelDVFSEnv(config=PREVIOUS, decision_fraction=0.2, **settings)  # type: ignore[arg-type]
    counts = []
    for env in (every, held):
        env.reset(seed=5, options={"budget": 0.01})
        action, done, decisions, total = np.array([1, env.advisor_action("fitting_plan")]), False, 0, 0.0
        while not done:
            _, reward, done, _, info = env.step(action)
            decisions, total = decisions + 1, total + reward
        counts.append((decisions, total, info["energy_saved_pct"]))
    np.testing.assert_array_equal(held.applied, every.applied)
    assert counts[1][0] <= 5 and counts[1][0] < counts[0][0]  # at most one decision per 20% of the run, after the first
    assert counts[1][1] == pytest.approx(counts[0][1]) and counts[1][2] == pytest.approx(counts[0][2])
    with pytest.raises(KdvfsError, match="decision_fraction"):
        KernelDVFSEnv(decision_fraction=1.0)


def _plans(latency_scale: float, min_segment_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(P, K) the plan advisors' schedules of the default step at one regime, and the step's (K, G) times."""
    env = KernelDVFSEnv(config=EnvConfig().without_disturbances(), latency_scales=(latency_scale,),
                        plan_budgets=(0.0, 0.01, 0.02), min_segment_s=min_segment_s)
    env.reset(seed=0)
    step = env.steps[0].repeated(env.config.run_steps)
    _, plans = decision_data(step, env.observation_spec, env.timing)
    return plans.pairs[:-1].T, step.time_s


def test_min_segment_s_floors_the_plans_segments_where_the_latency_would_not() -> None:
    """With ideal switching the plans change clocks at single kernels; ``min_segment_s`` keeps every segment of a
    multi-segment plan at least that long. Where the latency plus its spread is longer, the plans are unchanged."""
    floor_s = 3e-4
    plain, time_s = _plans(0.0, 0.0)
    floored, _ = _plans(0.0, floor_s)
    assert not all(segments_ok(time_s, plan, floor_s) for plan in plain)
    assert all(segments_ok(time_s, plan, floor_s) for plan in floored)
    assert any(len(switch_points(plan)) > 0 for plan in floored)  # still plans, not one pair throughout
    assert np.array_equal(_plans(1.0, 0.0)[0], _plans(1.0, floor_s)[0])
    with pytest.raises(KdvfsError, match="min_segment_s"):
        EnvConfig(min_segment_s=-1e-3)
