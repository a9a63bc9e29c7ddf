"""``benchmarks/h200/varying_recipes.py``'s figures and its window-noise ones (``varying_noise.py``), from records."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from benchmarks.h200.varying_noise import LONG_STEP_FACTOR, long_steps, window_noise
from kdvfs.runtime.controller.measurement.estimator import WindowRow, adjusted


def _windows(noise: np.ndarray) -> list[dict[str, Any]]:
    kernel = np.linspace(0.2, 0.4, len(noise))
    return [{"step_time_s": 0.1 + 0.5 * k + n, "kernel_steps": k, "new_inputs": [1.0], "start_s": 4.0 * i,
             "end_s": 4.0 * i + 3.0, "arm": "AB"[i % 2]} for i, (k, n) in enumerate(zip(kernel, noise, strict=True))]


def test_a_step_time_the_covariates_explain_leaves_no_residual() -> None:
    noise = window_noise(_windows(np.zeros(12)))
    assert noise is not None
    assert noise["new_inputs"] == [1.0, 1.0]
    assert noise["step_time_vs_kernel_correlation"] == pytest.approx(1.0)
    assert noise["adjusted_residual_pct"] == pytest.approx(0.0, abs=1e-9)


def test_the_residual_is_the_noise_the_covariates_leave() -> None:
    noise = np.random.default_rng(0).normal(0.0, 0.02, 400)
    figures = window_noise(_windows(noise))
    assert figures is not None
    mean_s = float(np.mean([w["step_time_s"] for w in _windows(noise)]))
    assert figures["adjusted_residual_pct"] == pytest.approx(100 * 0.02 / mean_s, rel=0.1)


def test_too_few_windows_give_none() -> None:
    assert window_noise(_windows(np.zeros(5))) is None


def test_the_steps_for_the_target_half_width_grow_with_the_square_of_the_half_width() -> None:
    from benchmarks.h200.varying_noise import TARGET_HALF_WIDTH_PCT, steps_for_half_width

    assert steps_for_half_width(300, TARGET_HALF_WIDTH_PCT) == 300
    assert steps_for_half_width(300, 1.5 * TARGET_HALF_WIDTH_PCT) == 300 * 9 // 4
    assert steps_for_half_width(300, None) is None


def test_long_steps_are_those_over_the_factor_times_the_median() -> None:
    steps = [{"step": i, "duration_s": 0.2} for i in range(9)] + [
        {"step": 9, "duration_s": 0.2 * LONG_STEP_FACTOR * 1.01}, {"step": 10, "duration_s": None},
        {"step": 11, "duration_s": 0.2 * LONG_STEP_FACTOR}]
    long = long_steps(steps)
    assert long["count"] == 1 and long["steps"] == [9] and long["median_s"] == 0.2
    assert long_steps([])["count"] == 0


def test_the_covariate_forms_are_compared_on_the_same_windows() -> None:
    """Joules follow the new tokens' count and not the new longest sample's (a packed batch's two inputs), and the
    host's pace: the estimate by position with the pace is exact; the run's (by position, without the pace) and
    those of the summed count or the share are not; a log without the share (an earlier run) gives None."""
    from benchmarks.h200.varying_noise import new_input_covariates

    rng = np.random.default_rng(1)
    windows, energies = [], []
    for i in range(16):
        share = rng.uniform(0.5, 1.0)
        tokens, longest = share * rng.uniform(0.0, 1.0), share * rng.uniform(0.0, 1.0)
        pace_s = rng.uniform(0.001, 0.002)
        arm = "AB"[i % 2]
        windows.append({"arm": arm, "steps": 10, "controlled_steps": 10 if arm == "B" else 0, "last_step": 10 * i,
                        "kernel_steps": 1.0, "new_inputs": [tokens, longest], "new_input_steps": share,
                        "start_s": 4.0 * i, "end_s": 4.0 * i + 3.0, "host_pace_s": pace_s})
        energies.append({"last_step": 10 * i, "energy_j_per_step": 20.0 + 5.0 * tokens + 2000.0 * pace_s
                         - (2.0 if arm == "B" else 0.0)})
    forms = new_input_covariates(windows, energies)
    assert forms is not None
    assert forms["host_pace"]["half_width_pct"] < 1e-6
    assert min(forms[name]["half_width_pct"] for name in ("run", "count", "share")) > 0.1
    assert new_input_covariates([{**w, "new_input_steps": None} for w in windows], energies) is None


def test_the_report_says_how_far_the_profiles_cost_model_is_calibrated() -> None:
    from benchmarks.h200.varying_recipes import profile_parameters
    from kdvfs.envs.gpu.profiles import load_profile

    statuses = profile_parameters("h200")
    assert statuses is not None and statuses.get("calibrated", 0) > 0
    assert sum(statuses.values()) == len(load_profile("h200").cost_model)
    assert profile_parameters(None) is None


def test_steps_during_a_background_solve_are_set_apart() -> None:
    from benchmarks.h200.varying_noise import during_solves

    steps = [{"step": i, "end_s": 0.1 * i, "duration_s": 0.2 if 10 < i <= 15 else 0.1} for i in range(30)]
    solved = [{"event": "bucket_planned", "bucket": "8x64", "end_s": 1.45, "solve_s": 0.4}]  # 1.05 s to 1.45 s
    figures = during_solves(steps, solved)
    assert figures is not None
    assert (figures["steps_during"], figures["median_s_during"]) == (5, 0.2)
    assert (figures["steps_other"], figures["median_s_other"]) == (24, 0.1)
    assert during_solves(steps, []) is None
    assert during_solves(steps, [{"end_s": 1.45}]) is None  # a log from before solve_s


def test_the_arm_effect_on_the_pace_is_reported() -> None:
    """Controlled windows' host 5% slower than auto's (and nothing else differs): the report's pace effect is
    +5%; a log without paces gives None."""
    from benchmarks.h200.varying_noise import host_pace_arm

    rng = np.random.default_rng(2)
    windows = []
    for i in range(20):
        arm = "AB"[i % 2]
        windows.append({"arm": arm, "steps": 10, "controlled_steps": 10 if arm == "B" else 0, "kernel_steps": 1.0,
                        "new_inputs": [0.0], "start_s": 4.0 * i, "end_s": 4.0 * i + 3.0,
                        "host_pace_s": 0.001 * (1.05 if arm == "B" else 1.0) * (1 + rng.normal(0, 0.001))})
    pace = host_pace_arm(windows)
    assert pace is not None and pace["effect_pct"] == pytest.approx(5.0, abs=0.2)
    assert pace["ci95_pct"][0] <= 5.0 <= pace["ci95_pct"][1]
    assert host_pace_arm([{**w, "host_pace_s": None} for w in windows]) is None


def _energy_windows(noise: np.ndarray) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Windows whose joules per step follow their expected kernel time exactly, plus ``noise``; every fourth at
    auto, as a run's A/B share has it."""
    kernel = np.linspace(0.2, 0.4, len(noise))
    windows = [{"arm": "A" if i % 4 == 1 else "B", "steps": 10, "controlled_steps": 0 if i % 4 == 1 else 10,
                "last_step": 10 * i, "kernel_steps": k, "new_inputs": [0.0], "start_s": 4.0 * i, "end_s": 4.0 * i + 3.0}
               for i, k in enumerate(kernel)]
    energies = [{"last_step": 10 * i, "energy_j_per_step": 20.0 + 50.0 * k + n}
                for i, (k, n) in enumerate(zip(kernel, noise, strict=True))]
    return windows, energies


def test_the_energy_floor_scales_with_the_noise_and_sets_the_steps_for_the_target() -> None:
    """Twice the noise, twice the least half-width; the steps for the target at the square of its ratio to it;
    never wider than the run's own estimator on the same windows (a quarter at auto, HC3); None under 8 windows."""
    from benchmarks.h200.varying_noise import TARGET_HALF_WIDTH_PCT, energy_floor

    noise = np.random.default_rng(3).normal(0.0, 0.8, 28)
    one, two = energy_floor(*_energy_windows(noise), 300), energy_floor(*_energy_windows(2 * noise), 300)
    assert one is not None and two is not None and one["windows"] == 28
    assert two["floor_half_width_pct"] == pytest.approx(2 * one["floor_half_width_pct"], rel=0.02)
    assert one["steps_for_target"] == math.ceil(300 * (one["floor_half_width_pct"] / TARGET_HALF_WIDTH_PCT) ** 2)
    windows, energies = _energy_windows(noise)
    joules = {e["last_step"]: e["energy_j_per_step"] for e in energies}
    own = adjusted([WindowRow(w["arm"] == "B", joules[w["last_step"]], w["kernel_steps"], (0.0,),
                              (w["start_s"] + w["end_s"]) / 2) for w in windows], -1.0)
    assert own is not None and one["floor_half_width_pct"] < own.half_width_pct
    assert energy_floor(*_energy_windows(noise[:7]), 300) is None
