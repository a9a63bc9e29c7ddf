"""Fit cost-model parameters to a sweep, and validate them by k-fold cross-validation over kernels.

Time parameters are fitted first (log-ratio residuals of every non-reference row), then power parameters
(relative residuals of every row, with work rates computed from the *measured* times). Validation predicts
held-out kernels from their reference row only: time from the reference duration and utilisations, power
from the utilisations and the *predicted* times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from kdvfs.common.arrays import Array
from kdvfs.envs.calibration.sweep import Sweep, SweepError
from kdvfs.envs.model.cost_model import CostParams, kernel_power_w, kernel_time_s

TIME_PARAMS = ("fixed_fraction", "boundness_exponent", "latency_floor", "memory_core_knee")
POWER_PARAMS = ("static_w", "leakage_w", "core_idle_w", "core_sm_w", "core_tensor_w", "voltage_min",
                "voltage_knee_fraction", "mem_background_w", "mem_background_exponent", "mem_traffic_w",
                "traffic_core_share")
PARAM_BOUNDS = {
    "fixed_fraction": (0.0, 0.6), "boundness_exponent": (0.5, 8.0), "latency_floor": (0.005, 0.6),
    "memory_core_knee": (0.2, 1.0), "voltage_min": (0.4, 1.0), "voltage_knee_fraction": (0.1, 0.95),
    "traffic_core_share": (0.0, 1.0), "mem_background_exponent": (0.5, 4.0), "boost_limit_fraction": (0.5, 1.0),
}


def initial_params(max_power_w: float) -> CostParams:
    """A neutral starting point for fitting, with watts scaled to the largest measured power."""
    return CostParams(
        fixed_fraction=0.05, boundness_exponent=2.0, latency_floor=0.1, memory_core_knee=0.6,
        static_w=0.15 * max_power_w, leakage_w=0.05 * max_power_w, core_idle_w=0.15 * max_power_w,
        core_sm_w=0.35 * max_power_w, core_tensor_w=0.2 * max_power_w, voltage_min=0.7,
        voltage_knee_fraction=0.5, mem_background_w=0.08 * max_power_w, mem_background_exponent=1.0,
        mem_traffic_w=0.15 * max_power_w,
        traffic_core_share=0.5,
        switch_stall_s=0.0, power_window_s=0.01, boost_limit_fraction=1.0,
    )


def param_bounds(names: Sequence[str], max_power_w: float) -> tuple[list[float], list[float]]:
    """Lower and upper fit bounds of each parameter (watts: 0 to twice the largest measured power)."""
    pairs = [PARAM_BOUNDS.get(name, (0.0, 2.0 * max_power_w)) for name in names]
    return [low for low, _ in pairs], [high for _, high in pairs]


def predict_time_s(params: CostParams, sweep: Sweep) -> Array:
    """(R,) predicted time of every row from its kernel's reference row."""
    return kernel_time_s(params, sweep.limits, sweep.row_inputs(), sweep.core_mhz, sweep.mem_mhz)


def predict_power_w(params: CostParams, sweep: Sweep, time_s: Array, reference_power: bool = True) -> Array:
    """(R,) predicted power of every row, given the time of each row.

    With ``reference_power`` the kernel's measured power at its reference row is an input (it calibrates the
    kernel's core activity); without it, power comes from the utilisations alone.
    """
    inputs = sweep.row_inputs() if reference_power else sweep.row_inputs_without_power()
    return kernel_power_w(params, sweep.limits, inputs, sweep.core_mhz, sweep.mem_mhz, time_s)


def _power_residuals(params: CostParams, sweep: Sweep) -> Array:
    """Relative power errors of both prediction paths (with and without reference power), every row."""
    return np.concatenate([predict_power_w(params, sweep, sweep.time_s, path) / sweep.power_w - 1.0
                           for path in (True, False)])


def _solve(params: CostParams, names: Sequence[str], residuals_of: Callable[[CostParams], Array],
           max_power_w: float) -> CostParams:
    start = [getattr(params, name) for name in names]
    low, high = param_bounds(names, max_power_w)
    start = list(np.clip(start, low, high))

    def residuals(values: Array) -> Array:
        candidate = replace(params, **dict(zip(names, (float(v) for v in values), strict=True)))
        return residuals_of(candidate)

    result = least_squares(residuals, start, bounds=(low, high), x_scale="jac", max_nfev=400)
    return replace(params, **dict(zip(names, (float(v) for v in result.x), strict=True)))


def identifiable(sweep: Sweep, names: Sequence[str]) -> list[str]:
    """The subset of ``names`` the sweep can determine (time needs >1 row per kernel; tensor needs tensor use)."""
    rows_per_kernel = np.bincount(sweep.kernel_index)
    keep = list(names)
    if rows_per_kernel.max() < 2:
        keep = [n for n in keep if n not in TIME_PARAMS]
    if not np.any(sweep.tensor_util > 0):
        keep = [n for n in keep if n != "core_tensor_w"]
    if len(np.unique(sweep.core_mhz)) < 3:
        keep = [n for n in keep if n not in ("voltage_min", "voltage_knee_fraction", "leakage_w", "traffic_core_share")]
    if len(np.unique(sweep.mem_mhz)) < 2:
        keep = [n for n in keep if n != "mem_background_w"]
    if len(np.unique(sweep.mem_mhz)) < 3:
        keep = [n for n in keep if n != "mem_background_exponent"]
    return keep


def fit_params(sweep: Sweep, initial: CostParams | None = None, free: Sequence[str] | None = None) -> CostParams:
    """Least-squares fit of the ``free`` parameters (default: every identifiable one) to a sweep."""
    max_power_w = float(sweep.power_w.max())
    params = initial or initial_params(max_power_w)
    names = identifiable(sweep, free if free is not None else TIME_PARAMS + POWER_PARAMS)
    if not names:
        raise SweepError(f"{sweep.source}: no parameter can be fitted from this sweep")
    reference = np.zeros(len(sweep.time_s), dtype=bool)
    reference[sweep.reference_rows] = True
    time_names = [n for n in names if n in TIME_PARAMS]
    if time_names:
        params = _solve(params, time_names,
                        lambda p: np.log(predict_time_s(p, sweep)[~reference] / sweep.time_s[~reference]), max_power_w)
    power_names = [n for n in names if n in POWER_PARAMS]
    if power_names:
        params = _solve(params, power_names, lambda p: _power_residuals(p, sweep), max_power_w)
    return params


@dataclass(frozen=True)
class Validation:
    """Held-out prediction errors (fractions; 0.05 = 5%).

    ``power_*`` predict with each kernel's measured power at its reference row as an input;
    ``power_mape_utilisation_only`` predicts power from the utilisations alone (as for profiler traces).
    """

    time_mape: float
    power_mape: float
    power_mape_utilisation_only: float
    time_median_ape: float
    power_median_ape: float
    worst_kernel: str
    worst_kernel_mape: float
    kernels: int
    points: int

    def as_json(self) -> dict[str, float | int | str]:
        return {"time_mape": self.time_mape, "power_mape": self.power_mape, "kernels": self.kernels,
                "points": self.points}


def _fold_errors(sweep: Sweep, held_out: Array, initial: CostParams | None) -> tuple[Sweep, Array, Array, Array]:
    """Held-out kernels' absolute relative errors: time, power, power from utilisations only (each (R,))."""
    train = sweep.subset(np.setdiff1d(np.arange(len(sweep.kernel_names)), held_out))
    params = fit_params(train, initial)
    test = sweep.subset(held_out)
    time = predict_time_s(params, test)
    errors = [np.abs(predict_power_w(params, test, time, path) / test.power_w - 1.0) for path in (True, False)]
    return test, np.abs(time / test.time_s - 1.0), errors[0], errors[1]


def cross_validate(sweep: Sweep, folds: int = 5, seed: int = 0, initial: CostParams | None = None) -> Validation:
    """k-fold by kernel: fit on the other kernels, predict each held-out kernel from its reference row."""
    kernels = len(sweep.kernel_names)
    if folds < 2:
        raise SweepError(f"{sweep.source}: {folds} folds leave nothing to fit or to hold out; use --folds 2 or more")
    if kernels < folds:
        raise SweepError(f"{sweep.source}: {kernels} kernels cannot be split into {folds} folds; use fewer folds")
    if np.bincount(sweep.kernel_index).max() < 2:
        raise SweepError(f"{sweep.source}: every kernel has one row, so no clock change can be predicted; validate "
                         "on a sweep that measures each kernel at several clock pairs")
    order = np.random.default_rng(seed).permutation(kernels)
    time_errors, power_errors, utilisation_errors, per_kernel = [], [], [], {}
    for held_out in np.array_split(order, folds):
        test, time_error, power_error, utilisation_error = _fold_errors(sweep, np.sort(held_out), initial)
        reference = np.zeros(len(test.time_s), dtype=bool)
        reference[test.reference_rows] = True
        time_errors.append(time_error[~reference])
        power_errors.append(power_error[~reference])
        utilisation_errors.append(utilisation_error)
        for j, name in enumerate(test.kernel_names):
            rows = test.kernel_index == j
            per_kernel[name] = float(np.mean(np.r_[time_error[rows & ~reference], power_error[rows]]))
    time_all, power_all = np.concatenate(time_errors), np.concatenate(power_errors)
    worst = max(per_kernel, key=per_kernel.__getitem__)
    return Validation(float(time_all.mean()), float(power_all.mean()), float(np.concatenate(utilisation_errors).mean()),
                      float(np.median(time_all)), float(np.median(power_all)), worst, per_kernel[worst], kernels,
                      len(time_all))

