"""Fitting the cost model to sweeps: recovery on model-generated data, identifiability, cross-validation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from kdvfs.common.paths import DATA_DIR
from kdvfs.envs.calibration.fit import (
    POWER_PARAMS,
    TIME_PARAMS,
    cross_validate,
    fit_params,
    identifiable,
    initial_params,
    predict_power_w,
    predict_time_s,
)
from kdvfs.envs.calibration.sweep import Sweep, SweepError, load_sweep
from kdvfs.envs.gpu.profiles import load_profile
from kdvfs.envs.model.cost_model import ClockLimits, CostParams, KernelInputs, kernel_power_w, kernel_time_s

TRUE = CostParams.from_profile(load_profile("h200"))
CORES = (990.0, 1320.0, 1650.0, 1980.0)
MEMS = (2201.0, 2701.0, 3201.0)
# (sm, dram, tensor): tensor GEMMs, a SIMT GEMM, copies, mixed and latency-bound kernels
UTILISATIONS = np.array([
    [0.93, 0.19, 0.93], [0.88, 0.15, 0.85], [0.90, 0.05, 0.0], [0.09, 0.90, 0.0], [0.12, 0.80, 0.0],
    [0.30, 0.60, 0.0], [0.50, 0.50, 0.2], [0.60, 0.30, 0.5], [0.02, 0.02, 0.0], [0.05, 0.10, 0.0],
    [0.70, 0.70, 0.0], [0.40, 0.20, 0.1],
])
ALL = TIME_PARAMS + POWER_PARAMS


def mape(predicted: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted / actual - 1.0)))


def synthetic_sweep(params: CostParams = TRUE, cores: Sequence[float] = CORES, mems: Sequence[float] = MEMS,
                    utilisations: np.ndarray = UTILISATIONS) -> Sweep:
    """Every kernel at every pair of the grid, times and powers from the model itself (reference: max clocks)."""
    core, mem = (grid.ravel() for grid in np.meshgrid(np.asarray(cores), np.asarray(mems), indexing="ij"))
    kernels, pairs = len(utilisations), len(core)
    index = np.repeat(np.arange(kernels), pairs)
    row_core, row_mem = np.tile(core, kernels), np.tile(mem, kernels)
    sm, dram, tensor = (utilisations[index, i] for i in range(3))
    limits = ClockLimits(max(cores), max(mems))
    inputs = KernelInputs(np.geomspace(2e-5, 5e-3, kernels)[index], np.full(len(index), limits.max_core_mhz),
                          np.full(len(index), limits.max_mem_mhz), sm, dram, tensor, np.full(len(index), np.nan))
    time_s = kernel_time_s(params, limits, inputs, row_core, row_mem)
    power_w = kernel_power_w(params, limits, inputs, row_core, row_mem, time_s)
    return Sweep("synthetic.sweep.csv", tuple(f"k{j}" for j in range(kernels)), index, row_core, row_mem, time_s,
                 power_w, sm, dram, tensor)


def one_row_per_kernel(sweep: Sweep) -> Sweep:
    """Kernel j only at the j-th pair of the 12-pair grid (rows are kernel-major, 12 pairs per kernel)."""
    rows = np.arange(12) * 13
    return Sweep(sweep.source, sweep.kernel_names, *(a[rows] for a in (
        sweep.kernel_index, sweep.core_mhz, sweep.mem_mhz, sweep.time_s, sweep.power_w, sweep.sm_util,
        sweep.dram_util, sweep.tensor_util)))


@pytest.fixture(scope="module")
def sweep() -> Sweep:
    return synthetic_sweep()


@pytest.fixture(scope="module")
def fitted(sweep: Sweep) -> CostParams:
    return fit_params(sweep, initial_params(float(sweep.power_w.max())))


def test_synthetic_sweep_reproduces_the_model_at_its_reference(sweep: Sweep) -> None:
    assert len(sweep.time_s) == 12 * 12 and sweep.limits == ClockLimits(1980.0, 3201.0)
    np.testing.assert_allclose(predict_time_s(TRUE, sweep), sweep.time_s, rtol=1e-12)
    np.testing.assert_allclose(predict_power_w(TRUE, sweep, sweep.time_s), sweep.power_w, rtol=1e-9)


def test_fit_recovers_times_and_powers_from_a_neutral_start(sweep: Sweep, fitted: CostParams) -> None:
    time = predict_time_s(fitted, sweep)
    assert mape(time, sweep.time_s) < 0.01
    for reference_power in (True, False):
        assert mape(predict_power_w(fitted, sweep, sweep.time_s, reference_power), sweep.power_w) < 0.01
        assert mape(predict_power_w(fitted, sweep, time, reference_power), sweep.power_w) < 0.01
    # Well-determined parameters come back. Weakly identifiable ones need not: every core clock of the grid is
    # above the voltage knee (990 / 1980 = 0.5 > 0.45), where v(f) is a line through (1, 1), so only its slope
    # (1 - voltage_min) / (1 - voltage_knee_fraction) matters; leakage_w * v is then affine in f and trades
    # with static_w (and core_idle_w's v^2 f); switch_stall_s and power_window_s are never fitted.
    for name in (*TIME_PARAMS, "core_sm_w", "core_tensor_w", "mem_background_w", "mem_traffic_w",
                 "traffic_core_share"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name

    def slope(p: CostParams) -> float:
        return (1.0 - p.voltage_min) / (1.0 - p.voltage_knee_fraction)

    assert slope(fitted) == pytest.approx(slope(TRUE), rel=0.02)


def test_fit_changes_only_free_parameters(sweep: Sweep) -> None:
    start = initial_params(float(sweep.power_w.max()))
    result = fit_params(sweep, start, ["static_w", "memory_core_knee"])
    changed = {name for name in CostParams.names() if getattr(result, name) != getattr(start, name)}
    assert changed <= {"static_w", "memory_core_knee"}
    with pytest.raises(SweepError, match="no parameter can be fitted"):
        fit_params(sweep, start, [])


def test_identifiable_keeps_everything_on_a_full_grid(sweep: Sweep) -> None:
    assert identifiable(sweep, ALL) == list(ALL)
    assert identifiable(sweep, ["static_w", "fixed_fraction"]) == ["static_w", "fixed_fraction"]


def test_identifiable_drops_time_parameters_with_one_row_per_kernel(sweep: Sweep) -> None:
    # kernel j only at the j-th pair of the grid: 12 pairs, 4 core and 3 memory clocks, still tensor use
    single = one_row_per_kernel(sweep)
    assert np.bincount(single.kernel_index).tolist() == [1] * 12
    assert len(set(zip(single.core_mhz.tolist(), single.mem_mhz.tolist(), strict=True))) == 12
    assert identifiable(single, ALL) == list(POWER_PARAMS)


def test_identifiable_drops_tensor_power_without_tensor_use() -> None:
    no_tensor = synthetic_sweep(utilisations=UTILISATIONS * np.array([1.0, 1.0, 0.0]))
    assert identifiable(no_tensor, ALL) == [n for n in ALL if n != "core_tensor_w"]


def test_identifiable_drops_the_voltage_curve_with_fewer_than_three_core_clocks() -> None:
    two_cores = synthetic_sweep(cores=(1320.0, 1980.0))
    voltage = {"voltage_min", "voltage_knee_fraction", "leakage_w", "traffic_core_share"}
    assert identifiable(two_cores, ALL) == [n for n in ALL if n not in voltage]
    assert set(identifiable(synthetic_sweep(cores=(990.0, 1320.0, 1980.0)), ALL)) == set(ALL)


def test_identifiable_drops_memory_background_with_one_memory_clock() -> None:
    one_memory = synthetic_sweep(mems=(3201.0,))
    background = ("mem_background_w", "mem_background_exponent")
    assert identifiable(one_memory, ALL) == [n for n in ALL if n not in background]
    start = initial_params(float(one_memory.power_w.max()))
    assert fit_params(one_memory, start).mem_background_w == start.mem_background_w


def test_cross_validation_on_model_generated_data_is_near_exact(sweep: Sweep) -> None:
    report = cross_validate(sweep, folds=2)
    assert report.time_mape < 1e-3 and report.power_mape < 1e-3
    assert report.power_mape_utilisation_only < 1e-3
    assert report.kernels == 12 and report.points == 12 * 11  # every non-reference row is held out once
    assert report.worst_kernel in sweep.kernel_names
    document = report.as_json()
    assert set(document) == {"time_mape", "power_mape", "kernels", "points"}
    assert document["time_mape"] == report.time_mape and document["points"] == 12 * 11


def test_cross_validation_needs_a_kernel_per_fold(sweep: Sweep) -> None:
    few = sweep.subset(np.arange(3))
    with pytest.raises(SweepError) as caught:
        cross_validate(few, folds=5)
    assert "synthetic.sweep.csv" in str(caught.value) and "3 kernels" in str(caught.value)
    assert "use fewer folds" in str(caught.value)


@pytest.mark.parametrize("folds", [1, 0, -2])
def test_cross_validation_rejects_fewer_than_two_folds(sweep: Sweep, folds: int) -> None:
    with pytest.raises(SweepError, match="folds"):
        cross_validate(sweep.subset(np.arange(4)), folds=folds)


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_cross_validation_refuses_a_sweep_with_nothing_to_hold_out(sweep: Sweep) -> None:
    with pytest.raises(SweepError, match=r"synthetic\.sweep\.csv"):
        cross_validate(one_row_per_kernel(sweep), folds=2)


def test_fit_from_the_profile_start_stays_put(sweep: Sweep) -> None:
    # Starting at the true parameters the residuals are already zero: the fit stays on an exact solution.
    result = fit_params(sweep, TRUE)
    assert mape(predict_time_s(result, sweep), sweep.time_s) < 1e-9
    assert mape(predict_power_w(result, sweep, sweep.time_s, False), sweep.power_w) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["gtx980", "gtx1080ti"])
def test_public_sweeps_meet_the_accuracy_targets(gpu: str) -> None:
    report = cross_validate(load_sweep(DATA_DIR / "sweeps" / f"{gpu}.sweep.csv"))
    print(gpu, report)
    assert report.kernels == 30
    assert report.time_mape <= 0.10
    assert report.power_mape <= 0.10


def test_the_memory_background_exponent_needs_three_memory_clocks() -> None:
    assert "mem_background_exponent" in identifiable(synthetic_sweep(), ALL)
    assert "mem_background_exponent" not in identifiable(synthetic_sweep(mems=(2201.0, 3201.0)), ALL)
    truth = replace(TRUE, mem_background_exponent=2.0)
    fitted = fit_params(synthetic_sweep(truth), TRUE, ["mem_background_w", "mem_background_exponent"])
    assert fitted.mem_background_exponent == pytest.approx(2.0, rel=0.02)
